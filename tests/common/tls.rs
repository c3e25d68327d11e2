//! A throw-away PKI for TLS tests: a CA, a server certificate for
//! 127.0.0.1 and localhost signed by it, and client certificates with any
//! subject, all written as PEM files in a temporary directory that lives as
//! long as the [`TestPki`].
//!
//! Keys are ECDSA P-256 in PKCS#8 PEM ("PRIVATE KEY"), which rustls (the
//! broker), OpenSSL (librdkafka) and Java's PEM key stores (Kafka's
//! `ssl.keystore.type=PEM`) all read. Nothing here is fixed or committed: every
//! test makes its own, so a certificate never expires under the suite.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A CA and the files of a server certificate it signed.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca: Certificate,
    ca_key: KeyPair,
    /// The CA certificate (PEM), what clients trust.
    pub ca_pem: String,
    pub ca_path: PathBuf,
    /// The server's certificate (PEM, leaf only) and key, for
    /// `--tls-cert` / `--tls-key`.
    pub server_cert_path: PathBuf,
    pub server_key_path: PathBuf,
}

/// A client certificate and key, as files and as PEM text.
pub struct ClientCert {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestPki {
    /// A new CA named `ca_name` with a server certificate for 127.0.0.1 and
    /// localhost.
    pub fn new(ca_name: &str) -> TestPki {
        let dir = tempfile::tempdir().expect("temp dir for the test PKI");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, ca_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key).expect("self-signed CA");
        let ca_pem = ca.pem();
        let ca_path = write(dir.path(), "ca.pem", &ca_pem);
        let mut pki = TestPki {
            dir,
            ca,
            ca_key,
            ca_pem,
            ca_path,
            server_cert_path: PathBuf::new(),
            server_key_path: PathBuf::new(),
        };
        let (cert, key) = pki.sign(
            &["127.0.0.1", "localhost"],
            &[(DnType::CommonName, "localhost")],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        pki.server_cert_path = write(pki.dir.path(), "server.pem", &cert);
        pki.server_key_path = write(pki.dir.path(), "server.key", &key);
        pki
    }

    /// The directory holding every file of this PKI.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client certificate whose subject is `subject`, in the
    /// certificate's order (which RFC 2253 reverses: `[(OrganizationName,
    /// "fjord"), (CommonName, "alice")]` is Kafka's `CN=alice,O=fjord`),
    /// written as `<file_stem>.pem` and `<file_stem>.key`.
    pub fn client(&self, file_stem: &str, subject: &[(DnType, &str)]) -> ClientCert {
        let (cert_pem, key_pem) = self.sign(&[], subject, ExtendedKeyUsagePurpose::ClientAuth);
        ClientCert {
            cert_path: write(self.dir.path(), &format!("{file_stem}.pem"), &cert_pem),
            key_path: write(self.dir.path(), &format!("{file_stem}.key"), &key_pem),
            cert_pem,
            key_pem,
        }
    }

    /// A certificate (PEM) and its new key (PKCS#8 PEM), signed by the CA.
    fn sign(
        &self,
        sans: &[&str],
        subject: &[(DnType, &str)],
        usage: ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let key = KeyPair::generate().expect("leaf key");
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        // Strings that parse as IP addresses become IP SANs, the rest DNS names.
        let mut params = CertificateParams::new(sans).expect("leaf params");
        // rcgen starts with a CN of its own, which would keep its place
        // first: the subject is exactly `subject`, in order.
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("sign a leaf certificate");
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}
