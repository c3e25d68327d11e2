//! The multi-host harness (`tests/common/netns.rs`) with a real broker: a
//! broker in one network namespace serves a librdkafka client in the test's
//! namespace and is reachable from the other hosts; cutting its host off
//! makes it unreachable from everywhere while it keeps running, and healing
//! the link makes the same broker serve again with nothing lost. Isolating
//! its host (`Net::isolate`) makes it unreachable from the other hosts
//! only, the test still reaching it, until it rejoins. The replication
//! tests of issue 30 are built on this.

mod common;

use common::client::{self, create_topic};
use common::netns::Net;
use common::{Broker, BrokerOpts};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Whether `from` (a host index, or None for the test's namespace) opens
/// a TCP connection to `to` within a second.
fn reaches(net: &Net, from: Option<usize>, to: SocketAddr) -> bool {
    match from {
        None => TcpStream::connect_timeout(&to, Duration::from_secs(1)).is_ok(),
        Some(i) => net
            .command(i, "timeout")
            .args([
                "1",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{}/{}", to.ip(), to.port()),
            ])
            .status()
            .expect("run bash in the namespace")
            .success(),
    }
}

#[test]
fn a_broker_in_a_namespace_serves_until_its_host_is_cut_off_and_again_when_healed() {
    let net = Net::new(3);
    let mut broker = Broker::start(BrokerOpts::default().cores(1).in_host(net.host(0)));
    let bootstrap = broker.bootstrap();
    let addr: SocketAddr = bootstrap.parse().expect("an address");
    assert_eq!(
        addr.ip(),
        net.host(0).addr,
        "the broker listens on its host's address"
    );

    create_topic(&bootstrap, "t", 1, &[]);
    client::produce_numbered(&bootstrap, "t", 0..10, Duration::from_secs(30));
    for from in [None, Some(1), Some(2)] {
        assert!(reaches(&net, from, addr), "{from:?} reaches the broker");
    }

    net.cut(0);
    for from in [None, Some(1), Some(2)] {
        assert!(
            !reaches(&net, from, addr),
            "{from:?} must not reach a cut host"
        );
    }
    broker.assert_alive();

    net.heal(0);
    common::wait_for(Duration::from_secs(10), "the healed host", || {
        reaches(&net, None, addr).then_some(())
    });
    client::produce_numbered(&bootstrap, "t", 10..20, Duration::from_secs(30));
    let got = client::consume(
        &bootstrap,
        "t",
        1,
        20,
        Duration::from_millis(500),
        Duration::from_secs(30),
    );
    let ids: Vec<usize> = got
        .iter()
        .map(|m| {
            String::from_utf8_lossy(m.value.as_deref().unwrap_or_default())
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());

    net.isolate(0);
    assert!(
        reaches(&net, None, addr),
        "the test reaches an isolated host"
    );
    for from in [Some(1), Some(2)] {
        assert!(
            !reaches(&net, from, addr),
            "{from:?} must not reach an isolated host"
        );
    }
    net.rejoin(0);
    for from in [None, Some(1), Some(2)] {
        assert!(
            reaches(&net, from, addr),
            "{from:?} reaches a rejoined host"
        );
    }
    broker.stop();
}
