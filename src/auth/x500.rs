//! The principal of a TLS client certificate: its subject distinguished
//! name as Kafka's DEFAULT `ssl.principal.mapping.rules` gives it, i.e.
//! Java's `X500Principal.getName()` (the RFC 2253 form), so that an ACL
//! written for stock Kafka (`User:CN=alice,OU=eng,O=fjord`) names the same
//! client here.
//!
//! What Java prints, checked against OpenJDK 17's `X500Principal` on the
//! DER names in the tests below (each test vector is Java's output):
//! - RDNs in reverse order of the certificate (RFC 2253 lists the most
//!   specific first), joined by `,`; the AVAs of a multi-valued RDN in the
//!   order of its encoding, joined by `+`;
//! - keywords for CN, C, L, ST, O, OU, STREET, DC and UID only; any other
//!   attribute (emailAddress, serialNumber...) is its dotted OID followed
//!   by `=#` and the lowercase hex of the value's whole DER encoding, as is
//!   a known attribute whose value is not a string type;
//! - a string value is its bytes read as UTF-8 (Java 17 does so for every
//!   string type, BMPString and T61String included), with `,=+<>#;"\`
//!   escaped by a backslash anywhere in it, a NUL as `\00`, and leading and
//!   trailing spaces (and carriage returns) each escaped by a backslash.
//!
//! The certificate was verified by rustls before it gets here, but the
//! parser trusts nothing: any malformed DER gives None, never a panic.

use std::fmt::Write;

/// `User:` + this is the principal of a client presenting `cert_der`;
/// None if its subject cannot be read.
pub fn subject_name(cert_der: &[u8]) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    let (cert, _) = expect(cert_der, TAG_SEQUENCE)?;
    let (tbs, _) = expect(cert, TAG_SEQUENCE)?;
    // TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber,
    //   signature, issuer, validity, subject, ... }
    let mut rest = tbs;
    if rest.first() == Some(&TAG_VERSION) {
        rest = tlv(rest)?.rest;
    }
    for _ in 0..4 {
        // serialNumber, signature, issuer, validity
        rest = tlv(rest)?.rest;
    }
    let subject = tlv(rest)?;
    if subject.tag != TAG_SEQUENCE {
        return None;
    }
    rfc2253(subject.whole)
}

/// The RFC 2253 string Java prints for the DER `Name` `name_der`.
pub fn rfc2253(name_der: &[u8]) -> Option<String> {
    let (rdns, _) = expect(name_der, TAG_SEQUENCE)?;
    let mut rdn_list = Vec::new();
    let mut rest = rdns;
    while !rest.is_empty() {
        let rdn = tlv(rest)?;
        if rdn.tag != TAG_SET {
            return None;
        }
        rdn_list.push(rdn.content);
        rest = rdn.rest;
    }
    let mut out = String::new();
    for (i, rdn) in rdn_list.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut avas = *rdn;
        let mut first = true;
        while !avas.is_empty() {
            let ava = tlv(avas)?;
            if ava.tag != TAG_SEQUENCE {
                return None;
            }
            if !first {
                out.push('+');
            }
            first = false;
            write_ava(&mut out, ava.content)?;
            avas = ava.rest;
        }
        if first {
            return None; // an empty RDN
        }
    }
    Some(out)
}

/// One `type=value` (AttributeTypeAndValue ::= SEQUENCE { OID, ANY }).
fn write_ava(out: &mut String, ava: &[u8]) -> Option<()> {
    let oid = tlv(ava)?;
    if oid.tag != TAG_OID {
        return None;
    }
    let value = tlv(oid.rest)?;
    if !value.rest.is_empty() {
        return None;
    }
    let oid = oid_string(oid.content)?;
    match keyword(&oid) {
        Some(k) if STRING_TAGS.contains(&value.tag) => {
            out.push_str(k);
            out.push('=');
            write_escaped(out, &String::from_utf8_lossy(value.content));
        }
        keyword => {
            out.push_str(keyword.unwrap_or(&oid));
            out.push_str("=#");
            for b in value.whole {
                let _ = write!(out, "{b:02x}");
            }
        }
    }
    Some(())
}

/// Java's escaping of a string value (`AVA.toRFC2253String`).
fn write_escaped(out: &mut String, value: &str) {
    let chars: Vec<char> = value.chars().collect();
    let blank = |c: char| c == ' ' || c == '\r';
    let lead = chars.iter().take_while(|&&c| blank(c)).count();
    let trail_from = chars.len() - chars.iter().rev().take_while(|&&c| blank(c)).count();
    for (i, &c) in chars.iter().enumerate() {
        match c {
            ',' | '=' | '+' | '<' | '>' | '#' | ';' | '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\0' => out.push_str("\\00"),
            _ if i < lead || i >= trail_from => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
}

/// The RFC 2253 keywords Java knows (`AVAKeyword`, RFC2253 standard).
fn keyword(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.9" => "STREET",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_VERSION: u8 = 0xa0;
/// The string types Java prints as text (`AVA.isDerString`, not
/// canonical): UTF8String, PrintableString, T61String, IA5String,
/// GeneralString, BMPString.
const STRING_TAGS: [u8; 6] = [0x0c, 0x13, 0x14, 0x16, 0x1b, 0x1e];

/// One DER element: its tag, content, whole encoding and what follows it.
struct Tlv<'a> {
    tag: u8,
    content: &'a [u8],
    whole: &'a [u8],
    rest: &'a [u8],
}

/// Reads one element (single-byte tags; definite lengths of up to 4 bytes).
fn tlv(input: &[u8]) -> Option<Tlv<'_>> {
    let (&tag, after_tag) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None; // multi-byte tag: never in a Name
    }
    let (&first, mut after_len) = after_tag.split_first()?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || after_len.len() < n {
            return None;
        }
        let len = after_len[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
        after_len = &after_len[n..];
        len
    };
    if after_len.len() < len {
        return None;
    }
    let header = input.len() - after_len.len();
    Some(Tlv {
        tag,
        content: &after_len[..len],
        whole: &input[..header + len],
        rest: &after_len[len..],
    })
}

/// The content of an element that must have tag `tag`, and what follows.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let t = tlv(input)?;
    (t.tag == tag).then_some((t.content, t.rest))
}

/// An OBJECT IDENTIFIER's content as dotted decimal.
fn oid_string(content: &[u8]) -> Option<String> {
    let mut arcs: Vec<u64> = Vec::new();
    let mut value: u64 = 0;
    for (i, &b) in content.iter().enumerate() {
        if value > (u64::MAX >> 7) {
            return None;
        }
        value = (value << 7) | (b & 0x7f) as u64;
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (value / 40).min(2);
                arcs.push(first);
                arcs.push(value - 40 * first);
            } else {
                arcs.push(value);
            }
            value = 0;
        } else if i == content.len() - 1 {
            return None; // the last arc is cut off
        }
    }
    if arcs.is_empty() {
        return None;
    }
    let mut s = String::new();
    for (i, a) in arcs.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        let _ = write!(s, "{a}");
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(hex: &str) -> Option<String> {
        let der: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        rfc2253(&der)
    }

    /// DER names and what OpenJDK 17 prints for them
    /// (`new X500Principal(der).getName()`).
    const JAVA: [(&str, &str); 18] = [
        ("302e310e300c060355040a1305666a6f7264310c300a060355040b1303656e67310e300c06035504031305616c696365", "CN=alice,OU=eng,O=fjord"),
        ("301a3118301606035504030c0f612c622b6322645c653c663e673b68", r#"CN=a\,b\+c\"d\\e\<f\>g\;h"#),
        ("3010310e300c06035504030c052368617368", r"CN=\#hash"),
        ("3010310e300c06035504031305206c656164", r"CN=\ lead"),
        ("3011310f300d06035504031306747261696c20", r"CN=trail\ "),
        ("3010310e300c06035504030c05613d622363", r"CN=a\=b\#c"),
        ("302f310e300c060355040a1305666a6f7264311d300a06035504031303626f62300f060a0992268993f22c640101130137", "CN=bob+UID=7,O=fjord"),
        ("302d310b3009060355040613024e4f311e300806035504031301613008060355040a13016d3008060355040b13017a", "CN=a+O=m+OU=z,C=NO"),
        ("3022310a300806035504031301783114301206092a864886f70d01090116056140622e63", "1.2.840.113549.1.9.1=#16056140622e63,CN=x"),
        ("302e31133011060a0992268993f22c6401191603636f6d31173015060a0992268993f22c64011916076578616d706c65", "DC=example,DC=com"),
        ("30143112301006035504030c09c39c6ec3af636f6465", "CN=Ünïcode"),
        ("303c310b3009060355040613024e4f310d300b060355040813044f736c6f310d300b060355040713044f736c6f310f300d060355040913064d61696e2031", "STREET=Main 1,L=Oslo,ST=Oslo,C=NO"),
        ("301631143008060355040313017830080603550405130131", "CN=x+2.5.4.5=#130131"),
        ("3011310f300d06035504031e060062006f0062", r"CN=\00b\00o\00b"),
        ("3041313f30080603550403130161300806035504051301733008060355040b13017a300e06092a864886f70d010901160165300f060a0992268993f22c640101130162", "CN=a+2.5.4.5=#130173+OU=z+1.2.840.113549.1.9.1=#160165+UID=b"),
        ("30263124300f060a0992268993f22c64010113016130110603550403130a7a7a7a7a7a7a7a7a7a7a", "UID=a+CN=zzzzzzzzzz"),
        ("3022310f300d060355040a0c06610044620044310f300d06035504030c064e756c6c0078", r"CN=Null\00x,O=a\00Db\00D"),
        // Long-form lengths; the string of docs/security.md's "TLS with
        // Kafka's clients".
        ("30819f310b3009060355040613024e4f310d300b060355040813044f736c6f31143012060355040a0c0b612b62202271223b3c783e310f300d060355040b1306206c65616420310d300b06035504030c0423626f62311e301c06092a864886f70d010901160f626f62406578616d706c652e636f6d31173015060a0992268993f22c64011916076578616d706c6531123010060a0992268993f22c64010113027531", r#"UID=u1,DC=example,1.2.840.113549.1.9.1=#160f626f62406578616d706c652e636f6d,CN=\#bob,OU=\ lead\ ,O=a\+b \"q\"\;\<x\>,ST=Oslo,C=NO"#),
    ];

    #[test]
    fn names_print_as_javas_x500_principal() {
        for (der, java) in JAVA {
            assert_eq!(name(der).as_deref(), Some(java), "{der}");
        }
    }

    #[test]
    fn escapes_specials_anywhere_and_blanks_at_the_ends_only() {
        let mut s = String::new();
        write_escaped(&mut s, "  a b,c+d\"e\\f<g>h;i#j=k ");
        assert_eq!(s, r#"\ \ a b\,c\+d\"e\\f\<g\>h\;i\#j\=k\ "#);
        let mut s = String::new();
        write_escaped(&mut s, "\r");
        assert_eq!(s, "\\\r");
    }

    #[test]
    fn malformed_names_are_none_not_a_panic() {
        let good = "302e310e300c060355040a1305666a6f7264310c300a060355040b1303656e67310e300c06035504031305616c696365";
        for cut in (0..good.len()).step_by(2) {
            if cut < good.len() {
                assert_eq!(name(&good[..cut]), None, "cut at {cut}");
            }
        }
        assert_eq!(name("3000"), Some(String::new()), "an empty name");
        assert_eq!(name("30023100"), None, "an empty RDN");
        assert_eq!(name("3084ffffffff"), None, "a length past the input");
        assert_eq!(name("301f"), None);
        assert_eq!(subject_name(&[]), None);
        assert_eq!(subject_name(&[0x30, 0x03, 0x30, 0x01, 0x02]), None);
    }

    #[test]
    fn oids_print_dotted() {
        assert_eq!(oid_string(&[0x55, 0x04, 0x03]).as_deref(), Some("2.5.4.3"));
        assert_eq!(
            oid_string(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01]).as_deref(),
            Some("1.2.840.113549.1.9.1")
        );
        assert_eq!(oid_string(&[0x2a, 0x86]), None);
        assert_eq!(oid_string(&[]), None);
    }

    /// The subject of a real certificate (rcgen), in the order it was
    /// written: O first, so Java prints CN first.
    #[test]
    fn reads_the_subject_of_a_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "fjord");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationalUnitName, "eng");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            subject_name(cert.der()).as_deref(),
            Some("CN=alice,OU=eng,O=fjord")
        );
    }
}
