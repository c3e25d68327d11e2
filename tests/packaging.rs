//! The packaging: the systemd unit passes `systemd-analyze verify`, the
//! shipped example config names every setting and each documented value
//! parses, the server build pulls in no librdkafka, tokio or plotters, and
//! the Debian package built by `cargo deb` installs and serves a real
//! librdkafka client. `.ci/run` installs systemd, dpkg-dev and cargo-deb;
//! a missing tool fails these tests rather than skipping them.

mod common;

use common::client::{self, await_deliveries, send, TestMessage};
use common::free_port_base;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UNIT: &str = "packaging/systemd/fjord.service";
const EXAMPLE_CONFIG: &str = "packaging/fjord.toml";
/// How long the installed broker may take to print `fjord: ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(repo(UNIT)).expect("read the unit");
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/fjord serve --config /etc/fjord/fjord.toml",
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=1048576",
        "Restart=on-failure",
        "User=fjord",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/fjord",
        "NoNewPrivileges=true",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit has {line:?}");
    }
    // verify checks that ExecStart's program exists: point it at the
    // binary under test, the unit otherwise unchanged.
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("fjord.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/bin/fjord", env!("CARGO_BIN_EXE_fjord")),
    )
    .expect("write the copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze (package systemd, installed by .ci/run)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // verify exits 0 on a misspelt setting and only warns: any output fails.
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

/// The long flags of `fjord serve --help`, without `--help`, `--config` and
/// the testing-only `--debug-*`.
fn serve_flags() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["serve", "--help"])
        .output()
        .expect("fjord serve --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let mut flags: Vec<String> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '=', '<']).next())
        .map(str::to_string)
        .filter(|f| !matches!(f.as_str(), "help" | "config") && !f.starts_with("debug-"))
        .collect();
    flags.dedup();
    assert!(flags.len() > 30, "parsed the flags of --help: {flags:?}");
    flags
}

#[test]
fn example_config_documents_every_setting_and_each_value_parses() {
    let text = std::fs::read_to_string(repo(EXAMPLE_CONFIG)).expect("read the example");
    for flag in serve_flags() {
        assert!(
            text.lines().any(|l| {
                let l = l.trim_start_matches("# ");
                l.starts_with(&format!("{flag} = "))
            }),
            "{EXAMPLE_CONFIG} documents `{flag}`"
        );
    }
    // As shipped, and with every commented-out setting switched on.
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(s)
                if s.split(" = ").next().is_some_and(|k| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                }) && s.contains(" = ") =>
            {
                s
            }
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    for (what, toml_text) in [("as shipped", text.as_str()), ("all on", &uncommented)] {
        let args: fjord::config::ServeArgs = toml::from_str(toml_text)
            .unwrap_or_else(|e| panic!("{EXAMPLE_CONFIG} {what} does not parse: {e}"));
        let config = args.resolve().expect("resolves");
        assert_eq!(config.data_dir, Path::new("/var/lib/fjord"), "{what}");
    }
}

#[test]
fn server_build_depends_on_no_librdkafka_tokio_or_plotters() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--no-default-features", "--features", "serve"])
        .args(["-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("glommio ")), "{tree}");
    for name in ["rdkafka", "rdkafka-sys", "tokio", "plotters"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(&format!("{name} "))),
            "the server build depends on {name}"
        );
    }
}

/// Builds the .deb with `cargo deb` (its own target dir, so that it does
/// not wait for the lock of the one running this test) and returns it.
fn build_deb() -> PathBuf {
    let target = repo("target/deb");
    let out = Command::new(env!("CARGO"))
        .args(["deb", "--output"])
        .arg(target.join("out"))
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("cargo deb (installed by .ci/run: cargo install cargo-deb --locked)");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo deb failed: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said.lines()
        .map(|l| PathBuf::from(l.trim()))
        .find(|p| {
            p.extension().is_some_and(|e| e == "deb") && !p.to_string_lossy().contains("dbgsym")
        })
        .unwrap_or_else(|| panic!("cargo deb named no .deb: {said}"))
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .expect("dpkg-deb");
    assert!(out.status.success(), "dpkg-deb {args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn debian_package_installs_and_its_broker_serves_a_client() {
    let started = Instant::now();
    let deb = build_deb();
    println!("built {} in {:?}", deb.display(), started.elapsed());
    let contents = dpkg_deb(&["--contents"], &deb);
    for path in [
        "./usr/bin/fjord",
        "./lib/systemd/system/fjord.service",
        "./etc/fjord/fjord.toml",
    ] {
        assert!(
            contents.contains(path),
            "the package holds {path}: {contents}"
        );
    }
    assert!(
        !contents.contains("/usr/lib/debug/"),
        "debug symbols are in the -dbgsym package, not this one"
    );
    let info = dpkg_deb(&["--info"], &deb);
    assert!(
        info.contains("postinst"),
        "the package creates its user: {info}"
    );

    // Installed for real where the test may (CI runs as root): dpkg runs
    // postinst, which creates the user and the data dir. Elsewhere the
    // package is unpacked into a scratch root and its binary run from there.
    let scratch = tempfile::tempdir().expect("tempdir");
    let is_root = unsafe { libc::geteuid() } == 0;
    let root = if is_root {
        let out = Command::new("dpkg")
            .arg("-i")
            .arg(&deb)
            .output()
            .expect("dpkg -i");
        assert!(
            out.status.success(),
            "dpkg -i: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let user = Command::new("getent")
            .args(["passwd", "fjord"])
            .output()
            .expect("getent");
        assert!(user.status.success(), "postinst created the fjord user");
        let home = String::from_utf8_lossy(&user.stdout);
        assert!(home.contains(":/var/lib/fjord:"), "{home}");
        assert!(
            Path::new("/var/lib/fjord").is_dir(),
            "postinst created /var/lib/fjord"
        );
        PathBuf::from("/")
    } else {
        let root = scratch.path().join("root");
        let out = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&root)
            .output()
            .expect("dpkg-deb -x");
        assert!(out.status.success());
        root
    };
    let binary = root.join("usr/bin/fjord");

    // The lean build: none of librdkafka's symbols or version string.
    let bytes = std::fs::read(&binary).expect("read the installed binary");
    for needle in [&b"rd_kafka_"[..], b"librdkafka"] {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "the packaged binary contains {:?}",
            String::from_utf8_lossy(needle)
        );
    }
    let help = Command::new(&binary)
        .arg("--help")
        .output()
        .expect("--help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("serve") && !help.contains("bench"), "{help}");

    // Its serve, with the shipped config (data dir overridden), answers a
    // real librdkafka producer and consumer.
    let port = free_port_base(1);
    let mut child = Command::new(&binary)
        .arg("serve")
        .arg("--config")
        .arg(root.join("etc/fjord/fjord.toml"))
        .arg("--data-dir")
        .arg(scratch.path().join("data"))
        .args(["--cores", "1", "--no-pin", "--listen", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run the installed fjord");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        assert!(
            Instant::now() < deadline,
            "the installed broker never got ready"
        );
        match stdout.next() {
            Some(Ok(l)) if l == "fjord: ready" => break,
            Some(_) => {}
            None => panic!("the installed broker exited: {:?}", child.wait()),
        }
    }
    let bootstrap = format!("127.0.0.1:{port}");
    let producer = client::producer(&bootstrap, &[("acks", "all")]);
    for id in 0..10 {
        send(
            &producer,
            "packaged",
            &TestMessage {
                id,
                key: vec![],
                value: format!("from the .deb {id}").into_bytes(),
                headers: vec![],
            },
        );
    }
    let delivered = await_deliveries(&producer, 10, Duration::from_secs(30));
    assert!(delivered.iter().all(|d| d.error.is_none()), "{delivered:?}");
    let consumed = client::consume(
        &bootstrap,
        "packaged",
        1,
        10,
        Duration::from_millis(200),
        Duration::from_secs(30),
    );
    assert_eq!(consumed.len(), 10);
    assert_eq!(consumed[9].value.as_deref(), Some(&b"from the .deb 9"[..]));

    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    if is_root {
        let out = Command::new("dpkg")
            .args(["-r", "fjord"])
            .output()
            .expect("dpkg -r");
        assert!(out.status.success(), "dpkg -r fjord");
    }
}
