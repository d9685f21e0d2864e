//! Hosts (src/hosts): real network namespaces, a real Redis in one, a partition that cuts
//! it from the others. Every test here needs user namespaces: where the kernel refuses
//! them, it fails saying so — a skipped partition test would pass without testing.

use std::io::{BufRead, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use lockslab::hosts::{HostedRedis, Hosts, Sides};

use crate::common;

const PASSWORD: &str = "hostsTestPassword1";

/// How long the test partition lasts: past the ~10 s after which TCP gives up a connection
/// whose packets its own kernel drops, and far short of the ~15 min it waits for a
/// network that went silent.
const PARTITION_OUTLASTS_LOCAL_DROPS: Duration = Duration::from_secs(20);

/// The hosts, or a loud failure saying why this machine cannot make them.
fn hosts(names: &[&str]) -> Hosts {
    match Hosts::new(names) {
        Ok(hosts) => hosts,
        Err(err) => panic!(
            "this machine cannot make hosts, so the partition tests cannot run here (they \
             are not skipped: a partition untested is a partition unknown): {err:#}"
        ),
    }
}

fn redis_addr(hosts: &Hosts, host: &str) -> SocketAddr {
    SocketAddr::new(
        hosts.addr(host).unwrap().into(),
        lockslab::hosts::HOSTED_REDIS_PORT,
    )
}

/// One request on a raw connection, and what came back within `patience`: the reply, or
/// the error (a timeout: nothing came).
fn ask(stream: &mut TcpStream, request: &str, patience: Duration) -> std::io::Result<String> {
    stream.write_all(format!("{request}\r\n").as_bytes())?;
    wait_reply(stream, patience)
}

fn wait_reply(stream: &mut TcpStream, patience: Duration) -> std::io::Result<String> {
    stream.set_read_timeout(Some(patience))?;
    let mut buffer = [0u8; 256];
    let n = stream.read(&mut buffer)?;
    Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

fn client_count(redis: &HostedRedis) -> usize {
    let mut control = redis.control().unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut control)
        .unwrap();
    list.lines()
        .filter(|line| line.contains("addr=10."))
        .count()
}

#[test]
fn a_partition_hangs_an_established_connection_and_heal_resumes_the_same_one() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts(&["client", "server"]);
    let redis = hosts.start_redis("server", dir.path(), PASSWORD).unwrap();
    let server_pid = lockslab::nemesis::Victim::pid(&redis);
    let to = redis_addr(&hosts, "server");
    let patience = Duration::from_secs(5);
    let mut stream = hosts.connect_from("client", to, patience).unwrap();
    assert_eq!(
        ask(&mut stream, &format!("AUTH {PASSWORD}"), patience).unwrap(),
        "+OK\r\n"
    );
    assert_eq!(client_count(&redis), 1, "one client, from the client host");

    let cut = hosts.partition(&Sides::new(&[&["server"]])).unwrap();
    assert_eq!(cut, [("client".to_string(), "server".to_string())]);
    match ask(&mut stream, "PING", Duration::from_millis(1500)) {
        Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a partitioned connection hangs; it gave {other:?}"),
    }
    // Silent both ways: a new connection is not refused, it waits (and gives up).
    match hosts.connect_from("client", to, Duration::from_millis(800)) {
        Err(err) => assert!(
            format!("{err:#}").contains("timed out"),
            "a connection across a partition times out, it is not refused: {err:#}"
        ),
        Ok(_) => panic!("a connection crossed the partition"),
    }
    // lockslab's own line to the server is not cut, and the server still counts the client.
    assert_eq!(client_count(&redis), 1);
    // A partition lasts: longer than a kernel that saw its own packets dropped would keep
    // the connection (one that drops them in the sender's own queue gave up after ~10 s).
    std::thread::sleep(PARTITION_OUTLASTS_LOCAL_DROPS);

    let healed = hosts.heal().unwrap();
    assert_eq!(healed, cut);
    // The PING sent during the partition is retransmitted by TCP: its answer comes on the
    // same connection, and the server never restarted.
    assert_eq!(
        wait_reply(&mut stream, Duration::from_secs(60)).unwrap(),
        "+PONG\r\n"
    );
    assert_eq!(ask(&mut stream, "PING", patience).unwrap(), "+PONG\r\n");
    assert_eq!(lockslab::nemesis::Victim::pid(&redis), server_pid);
    assert_eq!(client_count(&redis), 1);
}

#[test]
fn a_bridge_host_reaches_both_sides_of_a_partition() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts(&["left", "bridge", "right"]);
    let right = hosts.start_redis("right", dir.path(), PASSWORD).unwrap();
    let to = redis_addr(&hosts, "right");
    hosts
        .partition(&Sides::new(&[&["left"], &["right"]]))
        .unwrap();
    let patience = Duration::from_millis(800);
    assert!(hosts.connect_from("left", to, patience).is_err());
    let mut stream = hosts.connect_from("bridge", to, patience).unwrap();
    assert_eq!(
        ask(
            &mut stream,
            &format!("AUTH {PASSWORD}"),
            Duration::from_secs(5)
        )
        .unwrap(),
        "+OK\r\n"
    );
    drop(right);
}

/// Run by the test below in a process of its own: makes hosts with a Redis in one, says
/// every pid that holds them up, and waits to be killed.
#[test]
#[ignore = "a helper: run by hosts_die_with_a_sigkilled_lockslab"]
fn holds_hosts_until_killed() {
    let Some(dir) = std::env::var_os("LOCKSLAB_TEST_HOSTS_DIR") else {
        return;
    };
    let hosts = hosts(&["a", "b"]);
    let redis = hosts
        .start_redis("b", std::path::Path::new(&dir), PASSWORD)
        .unwrap();
    hosts.partition(&Sides::new(&[&["a"]])).unwrap();
    let pids: Vec<String> = hosts.pids().iter().map(i32::to_string).collect();
    println!("pids: {}", pids.join(" "));
    std::thread::sleep(Duration::from_secs(120));
    drop(redis);
}

#[test]
fn hosts_die_with_a_sigkilled_lockslab() {
    let dir = tempfile::tempdir().unwrap();
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args([
            "hosts::holds_hosts_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("LOCKSLAB_TEST_HOSTS_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(holder.stdout.take().unwrap());
    let said = (stdout.lines().map_while(Result::ok))
        .find(|line| line.starts_with("pids: "))
        .expect("the helper says its pids");
    let pids: Vec<i32> = (said["pids: ".len()..])
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    // The holder, two hosts' anchors and the Redis.
    assert_eq!(pids.len(), 4, "{said}");
    let networks: Vec<String> = (pids.iter())
        .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok())
        .map(|link| link.display().to_string())
        .collect();
    assert_eq!(networks.len(), 4, "every process is alive before the kill");

    holder.kill().unwrap();
    holder.wait().unwrap();
    let dead = |pid: &i32| matches!(common::proc_state(*pid), None | Some('Z'));
    assert!(
        common::eventually(Duration::from_secs(10), || pids.iter().all(dead)),
        "left behind: {:?}",
        (pids.iter())
            .filter(|pid| !dead(pid))
            .map(|pid| (pid, common::proc_state(*pid)))
            .collect::<Vec<_>>()
    );
    // And no process anywhere is still in one of the hosts' networks.
    let still_in: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path().join("ns/net")).ok())
        .map(|link| link.display().to_string())
        .filter(|net| networks.contains(net))
        .collect();
    assert!(
        still_in.is_empty(),
        "processes still in a host's network: {still_in:?}"
    );
}

/// A schedule written in the schedule language partitions two hosts, heals them, then
/// stalls the Redis "cluster"'s leader; the history records each as the nemesis did it.
#[test]
fn a_schedule_partitions_heals_and_stalls_and_the_history_records_each() {
    use lockslab::events::{Kind, What};
    use lockslab::labs::Stage;
    use lockslab::labs::faults::{Faults, Until};
    use lockslab::nemesis::schedule::Schedule;
    use lockslab::nemesis::{Fault, Nemesis, Victim};

    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts(&["client", "server"]);
    let mut redis = hosts.start_redis("server", dir.path(), PASSWORD).unwrap();
    let patience = Duration::from_secs(5);
    let mut stream = hosts
        .connect_from("client", redis_addr(&hosts, "server"), patience)
        .unwrap();
    assert_eq!(
        ask(&mut stream, &format!("AUTH {PASSWORD}"), patience).unwrap(),
        "+OK\r\n"
    );
    let schedule: Schedule = serde_json::from_str(
        r#"[{"at_ms": 0, "fault": "partition", "target": "client|server"},
            {"at_ms": 1500, "fault": "heal", "target": "client|server"},
            {"at_ms": 1600, "fault": "leader_stall", "target": "redis", "duration_ms": 300}]"#,
    )
    .unwrap();
    schedule
        .validate(&[], &["client", "server", "redis"])
        .unwrap();

    let mut stage = Stage::new(lockslab::output::Style {
        json: true,
        fancy: false,
    })
    .quiet();
    let mut nemesis = Nemesis::new();
    let mut faults = Faults::new(&schedule, &stage)
        .on_hosts(&hosts)
        .on_leader("redis", || Some("server".to_string()));
    let long = Duration::from_secs(30);
    let mut cast: [&mut dyn Victim; 1] = [&mut redis];
    let cut = Until::acted(Fault::Partition, "client|server", long);
    stage
        .play(&mut faults, &mut nemesis, &mut cast, cut)
        .unwrap();
    assert_eq!(hosts.cut_pairs().len(), 1);
    assert!(
        ask(&mut stream, "PING", Duration::from_millis(800)).is_err(),
        "the schedule's partition cuts the connection"
    );
    stage
        .play(&mut faults, &mut nemesis, &mut cast, Until::done(long))
        .unwrap();
    assert!(hosts.cut_pairs().is_empty());
    assert_eq!(
        wait_reply(&mut stream, Duration::from_secs(60)).unwrap(),
        "+PONG\r\n"
    );

    // Network faults' facts are not among `Event::fault`'s: read them from the event.
    let facts = |e: &lockslab::events::Event| match &e.what {
        What::NetFault(f) | What::NetHealed(f) => Some(f.clone()),
        _ => e.fault().cloned(),
    };
    let faults: Vec<(Kind, Option<Fault>, Option<String>)> = (stage.log.iter())
        .filter_map(|e| Some((e.kind(), facts(e)?.fault, facts(e)?.target)))
        .collect();
    let named = |kind, fault, target: &str| (kind, Some(fault), Some(target.to_string()));
    assert_eq!(
        faults,
        [
            named(Kind::NetFault, Fault::Partition, "client|server"),
            named(Kind::NetHealed, Fault::Heal, "client|server"),
            // The stall is aimed at the cluster, and lands on whoever leads it.
            named(Kind::Frozen, Fault::LeaderStall, "server"),
            named(Kind::Resumed, Fault::Resume, "server"),
        ]
    );
    let partition = stage
        .log
        .iter()
        .find(|e| e.kind() == Kind::NetFault)
        .unwrap();
    assert!(
        partition.text.contains("client–server"),
        "{}",
        partition.text
    );
    let heal = stage
        .log
        .iter()
        .find(|e| e.kind() == Kind::NetHealed)
        .unwrap();
    assert!(matches!(&heal.what, What::NetHealed(f) if f.lasted_ms.is_some()));
}
