//! Finding and starting servers, `lockslab up`/`down`/`status`, and what is left afterwards.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A lockslab command with no server configured at all, and its own state directory.
fn bare(args: &[&str], state_dir: &std::path::Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("LOCKSLAB_REDIS_URL")
        .env_remove("LOCKSLAB_ETCD_URL")
        .env_remove("LOCKSLAB_POSTGRES_URL")
        .env("LOCKSLAB_STATE_DIR", state_dir)
        .env("NO_COLOR", "1");
    command
}

/// Server processes that mention `dir` and are still alive (a zombie whose parent is init is
/// init's to reap, and counts as gone).
fn servers_in(dir: &str) -> Vec<(u32, char, String)> {
    processes_mentioning(dir)
        .into_iter()
        .filter(|(_, state, _)| *state != 'Z')
        .collect()
}

#[test]
fn private_servers_are_started_for_a_run_and_removed_after_it() {
    let state = tempfile::tempdir().unwrap();
    // The servers' data goes under a TMPDIR of this test's own, so we can see it removed.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let output = bare(
        &[&QUICK_LAB[..], &["--private-servers"]].concat(),
        state.path(),
    )
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("Redis    redis://default:***@127.0.0.1:")
            && text.contains("(private, started in"),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "the private servers' data was not removed: {left:?}"
    );
    let port = text
        .split("redis://default:***@127.0.0.1:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(5), || servers_in(&format!(
            "127.0.0.1:{port}"
        ))
        .is_empty()),
        "the private Redis on {port} is still running: {:?}",
        servers_in(&format!("127.0.0.1:{port}"))
    );
}

#[test]
fn up_status_down_keep_servers_between_commands() {
    let state = tempfile::tempdir().unwrap();
    let state_path = state.path().to_str().unwrap().to_string();
    // A failed assertion must not leave `up`'s servers running (a failed CI run left its
    // Redis for an hour).
    let _down = OnDrop(|| drop(bare(&["down"], state.path()).output()));
    let up = bare(&["up"], state.path()).output().unwrap();
    let up_text = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "{up_text}\n{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(
        up_text.contains("export LOCKSLAB_REDIS_URL=redis://default:"),
        "{up_text}"
    );
    assert!(
        up_text.contains("export LOCKSLAB_POSTGRES_URL=postgres://"),
        "{up_text}"
    );
    assert!(
        !servers_in(&state_path).is_empty(),
        "servers run after `up` exits"
    );

    let status = bare(&["status"], state.path()).output().unwrap();
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(
        status_text.lines().filter(|l| l.ends_with("  up")).count(),
        3,
        "{status_text}"
    );
    // Passwords hidden: `status` is what gets shown to a room.
    assert!(status_text.contains(":***@"), "{status_text}");

    // A lab with nothing configured finds `up`'s servers.
    let lab = bare(&QUICK_LAB, state.path()).output().unwrap();
    let lab_text = String::from_utf8_lossy(&lab.stdout);
    assert!(lab.status.success(), "{lab_text}");
    assert!(lab_text.contains("from `lockslab up`"), "{lab_text}");

    let down = bare(&["down"], state.path()).output().unwrap();
    assert!(down.status.success());
    assert!(
        eventually(Duration::from_secs(10), || servers_in(&state_path)
            .is_empty()),
        "left running after `down`: {:?}",
        servers_in(&state_path)
    );
    let status = bare(&["status"], state.path()).output().unwrap();
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("no servers"),
        "status after down"
    );
}

#[test]
fn the_hands_on_worker_without_shared_servers_says_how_to_get_them() {
    let state = tempfile::tempdir().unwrap();
    let output = bare(&["worker", "--private-servers"], state.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("lockslab up"), "{stderr}");
}

#[test]
fn sigterm_and_a_second_ctrl_c_clean_up_too() {
    for signals in [
        &[Signal::SIGTERM][..],
        &[Signal::SIGINT, Signal::SIGINT][..],
        &[Signal::SIGHUP][..],
    ] {
        let state = tempfile::tempdir().unwrap();
        let mut lab = bare(
            &["gc-pause", "--private-servers", "--ttl", "10s"],
            state.path(),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let lab_pid = lab.id();
        // Wait until worker A exists and is frozen (private servers first: initdb is slow on
        // a busy machine).
        let frozen = eventually(Duration::from_secs(60), || {
            children_of(lab_pid)
                .iter()
                .any(|(_, state, name)| name == "lockslab" && *state == 'T')
        });
        assert!(frozen, "A never froze: {:?}", children_of(lab_pid));
        let children: Vec<u32> = children_of(lab_pid)
            .iter()
            .map(|(pid, _, _)| *pid)
            .collect();
        for signal in signals {
            kill(Pid::from_raw(lab_pid as i32), *signal).unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
        let status = lab.wait().unwrap();
        assert_eq!(status.code(), Some(128 + signals[0] as i32), "{signals:?}");
        for pid in children {
            assert!(
                eventually(Duration::from_secs(5), || {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    stat.is_empty() || stat.contains(") Z")
                }),
                "child {pid} outlived lockslab after {signals:?}"
            );
        }
    }
}

/// `host:port` of a server URL, whatever credentials it carries.
fn address_of(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, at)| at);
    rest.split('/').next().unwrap().to_string()
}

/// Issue 20, section 1: the labs' Postgres role was a superuser that any local user reached
/// without a password, and `COPY … FROM PROGRAM` ran shell commands as Postgres's account.
#[test]
fn the_labs_postgres_role_cannot_run_programs_nor_reach_other_databases() {
    let url = &servers().postgres;
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let superuser: bool = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!superuser, "the labs' role is a superuser");
    client
        .batch_execute("CREATE TEMP TABLE attack (line text)")
        .unwrap();
    for attack in [
        "COPY attack FROM PROGRAM 'id'",
        "COPY attack TO PROGRAM 'cat > /dev/null'",
        "COPY attack FROM '/etc/passwd'",
        "CREATE ROLE intruder SUPERUSER LOGIN",
        "CREATE DATABASE elsewhere",
    ] {
        let err = client
            .batch_execute(attack)
            .expect_err(&format!("`{attack}` ran as the labs' role"));
        assert_eq!(
            err.code(),
            Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "`{attack}`: {err}"
        );
    }
    // The same credentials reach no other database.
    let (base, _) = url.rsplit_once('/').unwrap();
    for database in ["postgres", "template1"] {
        let err = postgres::Client::connect(&format!("{base}/{database}"), postgres::NoTls)
            .err()
            .unwrap_or_else(|| panic!("the labs' role connected to {database}"));
        assert_eq!(
            err.code(),
            Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{database}: {err}"
        );
    }
}

/// Issue 20, section 1: no server lockslab starts lets anyone in without a secret, on
/// loopback too.
#[test]
fn every_private_server_refuses_a_client_without_the_password() {
    let servers = servers();
    for user in ["lockslab", "lockslab_admin", "postgres"] {
        for password in ["", ":lockslab", ":wrong"] {
            let url = format!(
                "postgres://{user}{password}@{}/postgres",
                address_of(&servers.postgres)
            );
            assert!(
                postgres::Client::connect(&url, postgres::NoTls).is_err(),
                "Postgres let {user} in with {password:?}"
            );
        }
    }

    for url in [
        format!("redis://{}", address_of(&servers.redis)),
        format!("redis://default:wrong@{}", address_of(&servers.redis)),
    ] {
        let answer = redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .and_then(|mut connection| {
                redis::cmd("SET")
                    .arg("lockslab:attack")
                    .arg("1")
                    .query::<String>(&mut connection)
            });
        assert!(answer.is_err(), "Redis took SET from {url}");
    }
    // The password the URL carries is the one Redis wants, in the `default:PW@` form that
    // Debian 12's `redis-cli -u` reads.
    assert!(
        servers.redis.starts_with("redis://default:"),
        "{}",
        servers.redis
    );

    // etcd's JSON gateway, asked with no user: auth is on, so it refuses.
    let address = address_of(&servers.etcd);
    for path in ["/v3/kv/put", "/v3/kv/range"] {
        let answer = etcd_gateway(&address, path, r#"{"key":"Zm9v","value":"YmFy"}"#);
        assert!(
            answer.contains("user name is empty"),
            "etcd answered {path} without a user: {answer}"
        );
    }
}

/// The password in a URL's `user:password@`.
fn password_of(url: &str) -> &str {
    let credentials = url.split_once("://").unwrap().1.rsplit_once('@').unwrap().0;
    credentials.split_once(':').unwrap().1
}

/// A private Postgres starts from a copy of the cluster an earlier start's `initdb` made
/// (the template in the cache directory), and each copy gets passwords of its own before it
/// runs: neither the superuser's nor the labs' password of one start opens another's.
#[test]
fn postgres_copies_of_the_template_share_no_password() {
    let cache = tempfile::tempdir().unwrap();
    let serve = || common::start_serve_with(&[("XDG_CACHE_HOME", cache.path())]);
    let (mut first, first_stdin, first_urls) = serve();
    let templates = || {
        std::fs::read_dir(cache.path().join("lockslab"))
            .map(|entries| entries.flatten().count())
            .unwrap_or(0)
    };
    assert_eq!(templates(), 1, "the first start kept no template");
    let (mut second, second_stdin, second_urls) = serve();
    for (ours, theirs) in [(&first_urls, &second_urls), (&second_urls, &first_urls)] {
        for url in ["postgres_admin", "postgres"] {
            let (ours, theirs) = (ours[url].as_str().unwrap(), theirs[url].as_str().unwrap());
            assert_ne!(password_of(ours), password_of(theirs), "{url}");
            postgres::Client::connect(ours, postgres::NoTls)
                .unwrap_or_else(|e| panic!("{url}: its own password: {e}"));
            let user = ours.split_once("://").unwrap().1.split_once(':').unwrap().0;
            let (scheme_and_user, at) = ours.rsplit_once('@').unwrap();
            let (scheme, _) = scheme_and_user.split_once("://").unwrap();
            let with_theirs = format!("{scheme}://{user}:{}@{at}", password_of(theirs));
            assert!(
                postgres::Client::connect(&with_theirs, postgres::NoTls).is_err(),
                "{url}: the other start's password let {user} in"
            );
        }
    }
    drop((first_stdin, second_stdin));
    for keeper in [&mut first, &mut second] {
        keeper.wait().unwrap();
    }
}

/// One POST to etcd's JSON gateway, by hand: the whole answer.
fn etcd_gateway(address: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// A seat's shell (its exports set, no `up` of its own): `status` lists the servers the
/// environment names, passwords hidden, rather than saying there are none; `results` sends
/// it to the instructor's machine rather than telling it to start a room.
#[test]
fn a_seat_sees_its_servers_and_is_sent_to_the_instructor_for_results() {
    let state = tempfile::tempdir().unwrap();
    let status = lockslab(&["status"])
        .env("LOCKSLAB_STATE_DIR", state.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(text.contains("from the environment"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.ends_with("  up")).count(),
        3,
        "{text}"
    );
    assert!(!text.contains("no servers from"), "{text}");
    let password = servers()
        .redis
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.rsplit_once(':'))
        .unwrap()
        .1;
    assert!(
        !text.contains(password),
        "status shows the password: {text}"
    );
    assert!(text.contains("redis://default:***@"), "{text}");

    for seat in [
        ("LOCKSLAB_NAMESPACE", "seat07"),
        (
            "LOCKSLAB_POSTGRES_URL",
            "postgres://seat07:pw@127.0.0.1:1/seat07",
        ),
    ] {
        let results = bare(&["results"], state.path())
            .env(seat.0, seat.1)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&results.stderr);
        assert_eq!(results.status.code(), Some(4), "{seat:?}: {said}");
        assert!(said.contains("instructor's machine"), "{seat:?}: {said}");
        assert!(!said.contains("starts one"), "{seat:?}: {said}");
    }
    // Not a seat: nothing runs here, and `up --room` would start one.
    let results = bare(&["results"], state.path())
        .env_remove("LOCKSLAB_NAMESPACE")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&results.stderr);
    assert!(said.contains("no room is running"), "{said}");
}

/// A bare etcd on free loopback ports, killed and reaped when dropped.
struct BareEtcd {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl BareEtcd {
    fn start() -> BareEtcd {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (client, peer) = (free(), free());
        let dir = tempfile::tempdir().unwrap();
        let url = format!("http://127.0.0.1:{client}");
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args([
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{peer}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        BareEtcd {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for BareEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Hostile finding: etcd listens for a moment before it has a password, and a user added in
/// that moment (here, `evil`, as another local user could) would keep its rights once
/// lockslab turned auth on. lockslab now reads the users back and refuses to go on.
#[test]
fn a_user_someone_else_added_before_etcds_password_stops_the_start() {
    let seats = lockslab::servers::Seat::generate(1);
    for intruder in [false, true] {
        let etcd = BareEtcd::start();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut client = None;
            for _ in 0..100 {
                if let Ok(mut c) = etcd_client::Client::connect([etcd.url.as_str()], None).await
                    && c.status().await.is_ok()
                {
                    client = Some(c);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut client = client.expect("the bare etcd answers");
            if intruder {
                client.user_add("evil", "evilpw", None).await.unwrap();
            }
            // What lockslab makes: a seat's role and user, then root, then auth on.
            let seat = &seats[0].name;
            client.role_add(seat.as_str()).await.unwrap();
            client
                .role_grant_permission(
                    seat.as_str(),
                    etcd_client::Permission::read_write(format!("lockslab:{seat}_")).with_prefix(),
                )
                .await
                .unwrap();
            client.user_add(seat.as_str(), "pw", None).await.unwrap();
            client
                .user_grant_role(seat.as_str(), seat.as_str())
                .await
                .unwrap();
            client.user_add("root", "rootpw", None).await.unwrap();
            let _ = client.role_add("root").await;
            client.user_grant_role("root", "root").await.unwrap();
            client.auth_enable().await.unwrap();
        });
        let root = etcd.url.replacen("http://", "http://root:rootpw@", 1);
        let checked = lockslab::servers::check_no_one_else_got_in(&root, &seats);
        if intruder {
            let said = format!("{:#}", checked.unwrap_err());
            assert!(said.contains("evil"), "{said}");
        } else {
            checked.unwrap();
        }
    }
}
