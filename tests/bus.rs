//! The machine-local bus with real processes: election, failover, heartbeats,
//! fencing and hostile clients. Each test owns its `AGENT_RELAY_HOME`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use agent_relay::protocol::bus::*;
use agent_relay::wire::{self, Received};
use common::{FakeServer, Options, Sidecar, connected, home};
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;
use interprocess::local_socket::{GenericFilePath, ToFsName};
use tokio::io::AsyncWriteExt;

const BOT: &str = "123456789";

fn slot_of(status: &str) -> char {
    // "TG C·name ● follower"
    status.chars().nth(3).expect("a slot letter")
}

async fn spawn_sessions(home: &Path, fake: &FakeServer, n: usize) -> Vec<Sidecar> {
    let mut sidecars: Vec<Sidecar> = (0..n)
        .map(|_| Sidecar::spawn(Options::new(home).configured(fake)))
        .collect();
    for (i, s) in sidecars.iter_mut().enumerate() {
        s.handshake(&format!("/tmp/project-{i}"), &format!("s{i}"))
            .await;
    }
    for s in &sidecars {
        s.wait_status(connected).await;
    }
    sidecars
}

fn leaders(sidecars: &[Sidecar]) -> usize {
    sidecars
        .iter()
        .filter(|s| s.latest_status().is_some_and(|t| t.contains("● leader")))
        .count()
}

/// The epoch the session is synced at, if it is synced.
async fn synced_epoch(sidecar: &mut Sidecar) -> Option<u64> {
    let (_, text) = sidecar.command("telegram-status", "").await;
    let at = text.find("synced@")?;
    text[at + 7..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Polls `/telegram-status` until the session is synced at `epoch`: the
/// status line alone may never show the short reconnect in between.
async fn wait_synced_at(sidecar: &mut Sidecar, epoch: u64) {
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while synced_epoch(sidecar).await != Some(epoch) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never synced at epoch {epoch}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn raw_client(home: &Path) -> (wire::WireReader, wire::WireWriter) {
    let path = home.join("run").join(BOT).join("bus.sock");
    let name = path.to_fs_name::<GenericFilePath>().unwrap();
    wire::split(Stream::connect(name).await.expect("connect to the bus"))
}

async fn next_ack(reader: &mut wire::WireReader) -> Ack {
    loop {
        let frame = tokio::time::timeout(common::WAIT, reader.recv::<FromLeader>())
            .await
            .expect("the leader answers")
            .expect("read");
        match frame {
            Some(Received::Envelope(FromLeader::Ack(ack))) => return ack,
            Some(_) => continue,
            None => panic!("the leader closed the connection"),
        }
    }
}

#[tokio::test]
async fn five_sidecars_elect_exactly_one_leader_with_distinct_slots() {
    let home = home();
    let fake = common::fake().await;
    let mut sidecars = spawn_sessions(home.path(), &fake, 5).await;
    assert_eq!(leaders(&sidecars), 1);
    let mut slots: Vec<char> = sidecars
        .iter()
        .map(|s| slot_of(&s.latest_status().unwrap()))
        .collect();
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), 5, "slots must be distinct");
    let (ok, table) = sidecars[3].command("relay", "status").await;
    assert!(ok, "{table}");
    assert!(table.contains("5 session(s)"), "{table}");
    for i in 0..5 {
        assert!(table.contains(&format!("/tmp/project-{i}")), "{table}");
    }
}

#[tokio::test]
async fn sigkill_of_the_leader_elects_one_new_leader_and_keeps_every_slot() {
    let home = home();
    let fake = common::fake().await;
    let mut sidecars = spawn_sessions(home.path(), &fake, 5).await;
    let before_epoch = synced_epoch(&mut sidecars[0]).await.expect("synced");
    let slots: Vec<char> = sidecars
        .iter()
        .map(|s| slot_of(&s.latest_status().unwrap()))
        .collect();
    let leader = sidecars
        .iter()
        .position(|s| s.latest_status().unwrap().contains("● leader"))
        .unwrap();
    sidecars[leader].kill9().await;
    let mut survivors: Vec<(Sidecar, char)> = sidecars
        .into_iter()
        .zip(slots)
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, pair)| pair)
        .collect();
    // Everyone is back, on the new epoch.
    for (s, _) in survivors.iter_mut() {
        wait_synced_at(s, before_epoch + 1).await;
    }
    let sidecars_only: Vec<&Sidecar> = survivors.iter().map(|(s, _)| s).collect();
    let leader_count = sidecars_only
        .iter()
        .filter(|s| s.latest_status().unwrap().contains("● leader"))
        .count();
    assert_eq!(leader_count, 1);
    for (s, slot) in &survivors {
        assert_eq!(
            slot_of(&s.latest_status().unwrap()),
            *slot,
            "a survivor changed slot"
        );
    }
}

#[tokio::test]
async fn a_stopped_follower_is_dropped_and_comes_back_to_its_slot() {
    let home = home();
    let fake = common::fake().await;
    let mut sidecars = spawn_sessions(home.path(), &fake, 2).await;
    let follower = sidecars
        .iter()
        .position(|s| s.latest_status().unwrap().contains("● follower"))
        .unwrap();
    let leader = 1 - follower;
    let slot = slot_of(&sidecars[follower].latest_status().unwrap());
    sidecars[follower].signal(libc::SIGSTOP);
    // Dropped after three missed heartbeats, binding kept as offline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, table) = sidecars[leader].command("relay", "status").await;
        if table.contains("1 session(s)") {
            let line = table
                .lines()
                .find(|l| l.starts_with(slot))
                .unwrap_or_else(|| panic!("binding gone: {table}"));
            assert!(line.contains("offline"), "{table}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "follower never dropped: {table}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sidecars[follower].signal(libc::SIGCONT);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, table) = sidecars[leader].command("relay", "status").await;
        if table.contains("2 session(s)") {
            let line = table.lines().find(|l| l.starts_with(slot)).unwrap();
            assert!(line.contains("live"), "{table}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "follower never came back: {table}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        slot_of(&sidecars[follower].wait_status(connected).await),
        slot
    );
}

#[tokio::test]
async fn stale_generations_are_rejected() {
    let home = home();
    let fake = common::fake().await;
    let _leader = spawn_sessions(home.path(), &fake, 1).await;
    let (mut reader, mut writer) = raw_client(home.path()).await;
    let register = |id, generation| {
        ToLeader::Register(Register {
            instance_id: "raw-instance".into(),
            ..common::raw_register(id, "raw", generation)
        })
    };
    writer.send(&register(1, 5)).await.unwrap();
    assert!(next_ack(&mut reader).await.outcome.is_ok());

    writer
        .send(&ToLeader::Heartbeat(Heartbeat {
            id: 2,
            generation: 4,
        }))
        .await
        .unwrap();
    let ack = next_ack(&mut reader).await;
    assert_eq!(ack.outcome.unwrap_err().code, BusErrorCode::StaleGeneration);

    writer
        .send(&ToLeader::Disconnect(Disconnect {
            id: 3,
            generation: 4,
        }))
        .await
        .unwrap();
    let ack = next_ack(&mut reader).await;
    assert_eq!(ack.outcome.unwrap_err().code, BusErrorCode::StaleGeneration);

    // An old duplicate registration cannot replace the current one.
    writer.send(&register(4, 3)).await.unwrap();
    let ack = next_ack(&mut reader).await;
    assert_eq!(ack.outcome.unwrap_err().code, BusErrorCode::StaleGeneration);

    writer
        .send(&ToLeader::Heartbeat(Heartbeat {
            id: 5,
            generation: 5,
        }))
        .await
        .unwrap();
    assert!(
        next_ack(&mut reader).await.outcome.is_ok(),
        "the current generation still works"
    );
}

#[tokio::test]
async fn garbage_and_oversized_frames_do_not_disturb_the_others() {
    let home = home();
    let fake = common::fake().await;
    let mut sidecars = spawn_sessions(home.path(), &fake, 2).await;
    let path = home.path().join("run").join(BOT).join("bus.sock");
    let name = || path.clone().to_fs_name::<GenericFilePath>().unwrap();
    let mut raw = Stream::connect(name()).await.unwrap();
    raw.write_all(b"this is not json\n{\"kind\":\"warp\",\"id\":7}\n")
        .await
        .unwrap();
    let (mut raw_reader, _raw_writer) = wire::split(raw);
    let first = next_ack(&mut raw_reader).await;
    assert_eq!(first.outcome.unwrap_err().code, BusErrorCode::BadFrame);
    let second = next_ack(&mut raw_reader).await;
    assert_eq!(second.id, Some(7), "the id of a bad frame is echoed");
    // An oversized frame closes only that connection.
    let big = Stream::connect(name()).await.unwrap();
    let (mut big_reader, _big_writer) = {
        let mut big = big;
        // The leader may close the connection before all of it is written.
        let _ = big.write_all(&vec![b'x'; 2 * 1024 * 1024]).await;
        let _ = big.write_all(b"\n").await;
        wire::split(big)
    };
    let closed = tokio::time::timeout(common::WAIT, big_reader.recv::<FromLeader>())
        .await
        .expect("closed in time");
    assert!(
        matches!(closed, Ok(None) | Err(_)),
        "an oversized frame closes its connection: {closed:?}"
    );
    for s in sidecars.iter_mut() {
        let (ok, table) = s.command("relay", "status").await;
        assert!(ok && table.contains("2 session(s)"), "{table}");
    }
    assert_eq!(leaders(&sidecars), 1);
}

#[tokio::test]
async fn a_dead_leaders_socket_file_is_reclaimed() {
    let home = home();
    let fake = common::fake().await;
    let mut first = spawn_sessions(home.path(), &fake, 1).await;
    first[0].kill9().await;
    let socket = home.path().join("run").join(BOT).join("bus.sock");
    assert!(socket.exists(), "SIGKILL leaves the socket file behind");
    let second = spawn_sessions(home.path(), &fake, 1).await;
    assert!(second[0].latest_status().unwrap().contains("● leader"));
}

#[tokio::test]
async fn two_bots_never_share_a_bus() {
    let home = home();
    let fake = common::fake().await;
    let other = common::fake_with(common::FakeConfig {
        token: "987654321:BBHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_y".into(),
        ..Default::default()
    })
    .await;
    let mut a = Sidecar::spawn(Options::new(home.path()).configured(&fake));
    let mut b = Sidecar::spawn(Options::new(home.path()).configured(&other));
    a.handshake("/tmp/a", "a").await;
    b.handshake("/tmp/b", "b").await;
    assert!(a.wait_status(connected).await.contains("● leader"));
    assert!(b.wait_status(connected).await.contains("● leader"));
    let (_, table) = a.command("relay", "status").await;
    assert!(
        table.contains("1 session(s)") && !table.contains("/tmp/b"),
        "{table}"
    );
}

#[tokio::test]
async fn ten_sidecars_started_at_once_elect_one_leader() {
    let home = home();
    let fake = common::fake().await;
    let sidecars = spawn_sessions(home.path(), &fake, 10).await;
    assert_eq!(leaders(&sidecars), 1);
}

#[tokio::test]
async fn the_status_command_reads_the_bus_from_a_terminal() {
    let home = home();
    let fake = common::fake().await;
    let _sidecars = spawn_sessions(home.path(), &fake, 2).await;
    let output = tokio::process::Command::new(common::binary())
        .arg("status")
        .env_clear()
        .env("AGENT_RELAY_HOME", home.path())
        .env("TELEGRAM_BOT_TOKEN", common::TOKEN)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("2 session(s)") && text.contains("/tmp/project-1"),
        "{text}"
    );
}

#[test]
fn the_bus_directory_is_private_and_the_socket_is_0600() {
    use std::os::unix::fs::PermissionsExt;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let home = home();
    rt.block_on(async {
        let fake = common::fake().await;
        let _s = spawn_sessions(home.path(), &fake, 1).await;
        let dir = home.path().join("run").join(BOT);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("bus.sock")), 0o600);
    });
}

#[tokio::test]
async fn a_27th_live_session_gets_a_clear_error() {
    let home = home();
    let fake = common::fake().await;
    let _first = spawn_sessions(home.path(), &fake, 1).await;
    let mut clients = Vec::new();
    for i in 0..26u64 {
        let (mut reader, mut writer) = raw_client(home.path()).await;
        writer
            .send(&ToLeader::Register(common::raw_register(
                1,
                &format!("raw-{i}"),
                1,
            )))
            .await
            .unwrap();
        let ack = next_ack(&mut reader).await;
        if i < 25 {
            assert!(ack.outcome.is_ok(), "session {i}: {ack:?}");
        } else {
            let error = ack.outcome.expect_err("the 27th is refused");
            assert_eq!(error.code, BusErrorCode::NoFreeSlot);
            assert!(error.message.contains("26 slots"), "{}", error.message);
        }
        clients.push((reader, writer));
    }
    // The relay is unharmed.
    let (ok, table) = _first
        .into_iter()
        .next()
        .unwrap()
        .command("relay", "status")
        .await;
    assert!(ok && table.contains("26 session(s)"), "{table}");
}
