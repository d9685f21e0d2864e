//! Faults on a private server, as labs 5 and 6 use them: a crash and a restart on the same
//! port (a Redis without persistence comes back empty), and a freeze.

use std::time::Duration;

use lockslab::connect::Backend;
use lockslab::servers::{Lifetime, PrivateServers};

fn redis(url: &str) -> redis::Connection {
    let connection = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    connection
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    connection
}

#[test]
fn a_crashed_redis_comes_back_on_its_port_with_nothing_in_it() {
    let mut servers = PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun).unwrap();
    let url = servers.url(Backend::Redis).unwrap();
    let before = servers.pid(Backend::Redis).unwrap();
    let mut conn = redis(&url);
    let token: i64 = redis::cmd("INCR").arg("fence").query(&mut conn).unwrap();
    assert_eq!(token, 1);

    servers.crash_and_restart(Backend::Redis).unwrap();
    assert_eq!(servers.url(Backend::Redis).unwrap(), url, "same port");
    let after = servers.pid(Backend::Redis).unwrap();
    assert_ne!(before, after);
    assert!(!std::path::Path::new(&format!("/proc/{before}")).exists());
    let mut conn = redis(&url);
    let token: i64 = redis::cmd("INCR").arg("fence").query(&mut conn).unwrap();
    assert_eq!(token, 1, "the counter starts again: the token is reissued");

    servers.freeze(Backend::Redis).unwrap();
    let frozen = redis::cmd("PING").query::<String>(&mut conn);
    assert!(
        frozen.is_err(),
        "a frozen server answers nothing: {frozen:?}"
    );
    servers.thaw(Backend::Redis).unwrap();
    let mut conn = redis(&url);
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut conn).unwrap(),
        "PONG"
    );

    let dir = servers.dir.clone();
    servers.stop();
    assert!(!dir.exists());
    assert!(!std::path::Path::new(&format!("/proc/{after}")).exists());
}
