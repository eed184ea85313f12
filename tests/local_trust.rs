//! Trust nothing on the machine (issue 13): another local user's directories,
//! sockets and config files are refused with the path and the fix, by every
//! command; the relay's own files are private whatever the umask; a host that
//! stops reading cannot grow its sidecar.
//!
//! The tests that need a second uid run the victim as an unused uid (the
//! test process, root in CI, plays the other user); without root they say
//! so and skip. Everything else runs as anyone.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_relay::election::{BusDir, check_peer_is_me};
use common::{CHAT, FakeServer, TOKEN, USER, WAIT};
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;
use interprocess::local_socket::{GenericFilePath, ToFsName};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

/// The bot of [`TOKEN`].
const BOT: &str = "123456789";

fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn skip_unless_root(what: &str) -> bool {
    if !root() {
        eprintln!("skipped: {what} needs root to run a second uid (CI runs as root)");
    }
    !root()
}

/// A uid no account has, from `from` on.
fn unused_uid(from: u32) -> u32 {
    (from..from + 1000)
        // SAFETY: getpwuid with any uid; the result is only compared to null.
        .find(|&uid| unsafe { libc::getpwuid(uid).is_null() })
        .expect("a free uid")
}

/// The victim, and the other user who plants things for it.
fn uids() -> (u32, u32) {
    let victim = unused_uid(61_000);
    (victim, unused_uid(victim + 1))
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("chown {uid} {}: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o7777
}

/// A home of `uid`'s own (0700 in /tmp).
fn home_of(uid: Option<u32>) -> tempfile::TempDir {
    let home = common::home();
    if let Some(uid) = uid {
        chown(home.path(), uid);
    }
    home
}

/// The environment of a sidecar configured for `fake`.
fn configured(fake: &FakeServer) -> Vec<(String, String)> {
    vec![
        ("TELEGRAM_BOT_TOKEN".into(), fake.api().token()),
        ("AGENT_RELAY_CHAT_ID".into(), CHAT.to_string()),
        ("AGENT_RELAY_ALLOWED_USERS".into(), USER.to_string()),
        ("AGENT_RELAY_API_URL".into(), fake.url()),
    ]
}

fn command(
    args: &[&str],
    env: &[(String, String)],
    uid: Option<u32>,
    umask: Option<libc::mode_t>,
) -> Command {
    let mut command = Command::new(common::binary());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AGENT_RELAY_LOG", "debug")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true);
    if let Some(uid) = uid {
        // std drops the supplementary groups when root sets a uid.
        command.uid(uid).gid(uid);
    }
    if let Some(mask) = umask {
        // SAFETY: umask is async-signal-safe and cannot fail.
        unsafe {
            command.pre_exec(move || {
                libc::umask(mask);
                Ok(())
            });
        }
    }
    command
}

/// `agent-relay <args>` to its end.
async fn run(args: &[&str], env: &[(String, String)], uid: Option<u32>) -> Output {
    let mut command = command(args, env, uid, None);
    command.stdin(Stdio::null());
    tokio::time::timeout(WAIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("agent-relay {args:?} ends in time"))
        .expect("spawn agent-relay")
}

/// A TCP listener that counts who connects: the `api_url` of a planted
/// config, which must never hear from the relay.
struct Trap {
    url: String,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Trap {
    async fn new() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the trap");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(connection);
            }
        });
        Self { url, hits, task }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A unix socket another user serves: counts who connects.
struct FakeLeader {
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeLeader {
    fn bind(path: &Path, owner: u32) -> Self {
        let listener = tokio::net::UnixListener::bind(path).expect("bind the planted socket");
        chown(path, owner);
        set_mode(path, 0o777);
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(connection);
            }
        });
        Self { hits, task }
    }
}

impl Drop for FakeLeader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A sidecar driven as a host would, with its stderr kept.
struct Sidecar {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Arc<Mutex<Vec<Value>>>,
    changed: Arc<Notify>,
    stderr: Arc<Mutex<String>>,
    next_id: u64,
}

impl Sidecar {
    fn spawn(env: &[(String, String)], uid: Option<u32>, umask: Option<libc::mode_t>) -> Self {
        let mut command = command(&["stdio"], env, uid, umask);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn agent-relay stdio");
        let stdout = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let messages: Arc<Mutex<Vec<Value>>> = Arc::default();
        let changed = Arc::new(Notify::new());
        let stderr: Arc<Mutex<String>> = Arc::default();
        {
            let (messages, changed) = (Arc::clone(&messages), Arc::clone(&changed));
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let value =
                        serde_json::from_str(&line).unwrap_or_else(|_| json!({"garbage": line}));
                    messages.lock().expect("messages").push(value);
                    changed.notify_waiters();
                }
            });
        }
        {
            let (stderr, changed) = (Arc::clone(&stderr), Arc::clone(&changed));
            tokio::spawn(async move {
                let mut buf = [0; 4096];
                while let Ok(n @ 1..) = err.read(&mut buf).await {
                    stderr
                        .lock()
                        .expect("stderr")
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                    changed.notify_waiters();
                }
            });
        }
        Self {
            stdin: child.stdin.take(),
            child,
            messages,
            changed,
            stderr,
            next_id: 0,
        }
    }

    /// Waits until `found` picks something from the messages.
    async fn wait<T>(&self, what: &str, found: impl Fn(&[Value]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(found) = found(&self.messages.lock().expect("messages")) {
                return found;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "no {what} in time; messages {:?}, stderr {:?}",
                    self.messages.lock().expect("messages"),
                    self.stderr()
                );
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the sidecar");
        let answer = self
            .wait(method, |m| m.iter().find(|m| m["id"] == id).cloned())
            .await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    async fn handshake(&mut self, name: &str) {
        self.call(
            "initialize",
            json!({
                "protocolVersion": 1,
                "host": {"name": "test-host", "version": "1"},
                "cwd": "/tmp",
                "session": {"id": name, "name": name},
                "hasUI": true
            }),
        )
        .await;
        let line = json!({"jsonrpc": "2.0", "method": "initialized", "params": {}});
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the sidecar");
    }

    async fn telegram_status(&mut self) -> String {
        let result = self
            .call(
                "command/execute",
                json!({"name": "telegram-status", "args": ""}),
            )
            .await;
        result["message"].as_str().expect("a message").to_string()
    }

    async fn wait_status(&self, want: impl Fn(&str) -> bool) -> String {
        self.wait("status line", |messages| {
            messages
                .iter()
                .rev()
                .find(|m| m["method"] == "ui/setStatus")
                .and_then(|m| m["params"]["text"].as_str())
                .filter(|text| want(text))
                .map(String::from)
        })
        .await
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    async fn wait_stderr(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let text = self.stderr();
            if text.contains(needle) {
                return text;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("no {needle:?} on stderr: {text:?}");
            }
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn connected(status: &str) -> bool {
    status.ends_with("● leader") || status.ends_with("● follower")
}

/// The sidecar refuses to join, and says where and why on its status line,
/// in /telegram-status and on stderr.
async fn assert_refuses(sidecar: &mut Sidecar, path: &Path, why: &str) {
    let wanted = format!("{} {why}", path.display());
    sidecar.handshake("victim").await;
    sidecar.wait_status(|s| s == "TG ⚠ config error").await;
    let report = sidecar.telegram_status().await;
    assert!(report.contains(&wanted), "{wanted:?} not in {report:?}");
    let stderr = sidecar.wait_stderr(&wanted).await;
    assert!(stderr.contains("refusing to join the relay"), "{stderr}");
}

#[tokio::test]
async fn a_bus_directory_another_user_made_is_never_used() {
    if skip_unless_root("running the victim as another uid") {
        return;
    }
    let (victim, other) = uids();
    let fake = common::fake().await;

    // 1. No XDG runtime dir of its own: the runtime dir sits in a shared,
    //    sticky one (like the $TMPDIR fallback), and the other user was
    //    there first with agent-relay/<bot>/bus.sock.
    let shared = common::home();
    set_mode(shared.path(), 0o1777);
    let taken = shared.path().join("agent-relay");
    std::fs::create_dir_all(taken.join(BOT)).expect("plant the bus dir");
    let leader = FakeLeader::bind(&taken.join(BOT).join("bus.sock"), other);
    chown(&taken.join(BOT), other);
    chown(&taken, other);
    let home = home_of(Some(victim));
    let mut env = configured(&fake);
    env.push(("HOME".into(), home.path().display().to_string()));
    env.push((
        "XDG_RUNTIME_DIR".into(),
        shared.path().display().to_string(),
    ));
    let mut sidecar = Sidecar::spawn(&env, Some(victim), None);
    let why = format!("is owned by uid {other}, not you (uid {victim})");
    assert_refuses(&mut sidecar, &taken, &why).await;
    assert!(
        sidecar
            .stderr()
            .contains("remove it or set AGENT_RELAY_HOME"),
        "{}",
        sidecar.stderr()
    );

    // 2. The home is world-writable (sticky): the other user made run/<bot>/.
    let open_home = home_of(Some(victim));
    set_mode(open_home.path(), 0o1777);
    std::fs::create_dir_all(open_home.path().join("run").join(BOT)).expect("plant run/<bot>");
    let leader2 = FakeLeader::bind(
        &open_home.path().join("run").join(BOT).join("bus.sock"),
        other,
    );
    chown(&open_home.path().join("run").join(BOT), other);
    chown(&open_home.path().join("run"), other);
    let mut env = configured(&fake);
    env.push((
        "AGENT_RELAY_HOME".into(),
        open_home.path().display().to_string(),
    ));
    let mut sidecar2 = Sidecar::spawn(&env, Some(victim), None);
    assert_refuses(
        &mut sidecar2,
        open_home.path(),
        "can be written by other users (mode 1777)",
    )
    .await;

    // 3. AGENT_RELAY_HOME names a folder in a shared directory that the
    //    other user created first.
    let tmp = common::home();
    set_mode(tmp.path(), 0o1777);
    let planted = tmp.path().join("relay");
    std::fs::create_dir_all(planted.join("run").join(BOT)).expect("plant the home");
    let leader3 = FakeLeader::bind(&planted.join("run").join(BOT).join("bus.sock"), other);
    for dir in [
        planted.join("run").join(BOT),
        planted.join("run"),
        planted.clone(),
    ] {
        chown(&dir, other);
        set_mode(&dir, 0o755);
    }
    let mut env = configured(&fake);
    env.push(("AGENT_RELAY_HOME".into(), planted.display().to_string()));
    let mut sidecar3 = Sidecar::spawn(&env, Some(victim), None);
    assert_refuses(&mut sidecar3, &planted, &why).await;

    // Time enough for a member's first connect and a few retries.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (n, leader) in [leader, leader2, leader3].iter().enumerate() {
        assert_eq!(
            leader.hits.load(Ordering::SeqCst),
            0,
            "case {}: the victim connected to the planted socket",
            n + 1
        );
    }
    assert!(
        fake.api().calls().is_empty(),
        "a refused sidecar called Telegram"
    );
}

#[tokio::test]
async fn a_leader_of_another_uid_fails_the_members_peer_check() {
    if skip_unless_root("running a leader as another uid") {
        return;
    }
    let (victim, _) = uids();
    let fake = common::fake().await;
    let home = home_of(Some(victim));
    let mut env = configured(&fake);
    env.push(("AGENT_RELAY_HOME".into(), home.path().display().to_string()));
    let mut leader = Sidecar::spawn(&env, Some(victim), None);
    leader.handshake("theirs").await;
    leader.wait_status(connected).await;

    // Root can reach the socket, but it is not root's leader: the checked
    // connect refuses the directory, and a raw connect fails the peer check.
    let bus_dir = home.path().join("run").join(BOT);
    let err = BusDir::new(bus_dir.clone())
        .connect()
        .await
        .expect_err("another user's bus directory");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    let name = bus_dir
        .join("bus.sock")
        .to_fs_name::<GenericFilePath>()
        .expect("socket name")
        .into_owned();
    let stream = Stream::connect(name).await.expect("raw connect");
    let err = check_peer_is_me(&stream).expect_err("served by another uid");
    assert!(
        err.to_string()
            .contains(&format!("runs as uid {victim}, not as you (uid 0)")),
        "{err}"
    );

    // Our own leader passes both.
    let own = common::home();
    let mut env = configured(&fake);
    env.push(("AGENT_RELAY_HOME".into(), own.path().display().to_string()));
    let mut ours = Sidecar::spawn(&env, None, None);
    ours.handshake("ours").await;
    ours.wait_status(connected).await;
    let stream = BusDir::new(own.path().join("run").join(BOT))
        .connect()
        .await
        .expect("our own leader");
    check_peer_is_me(&stream).expect("our own uid");
}

/// A home whose config.toml points `api_url` at `trap`, with the token.
fn planted_config(home: &Path, trap: &Trap) -> PathBuf {
    let dir = home.join("config");
    std::fs::create_dir_all(&dir).expect("config dir");
    set_mode(&dir, 0o700);
    let file = dir.join("config.toml");
    std::fs::write(
        &file,
        format!("bot_token = \"{TOKEN}\"\napi_url = \"{}\"\n", trap.url),
    )
    .expect("write config.toml");
    file
}

/// `doctor` and `status` both refuse `file` with `why` and the `fix`.
async fn assert_commands_refuse(
    env: &[(String, String)],
    uid: Option<u32>,
    file: &Path,
    why: &str,
    fix: &str,
) {
    let problem = format!("{} {why}", file.display());
    let doctor = run(&["doctor"], env, uid).await;
    let stdout = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("✗ files: {problem} — fix: {fix}")),
        "{problem:?} / {fix:?} not in {stdout}"
    );
    let status = run(&["status"], env, uid).await;
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{problem}: {fix}")),
        "{problem:?} / {fix:?} not in {stderr}"
    );
    assert_eq!(stderr.matches(why).count(), 1, "said once: {stderr}");
}

#[tokio::test]
async fn a_config_others_may_write_is_refused_by_doctor_and_status_and_its_api_url_hears_nothing() {
    let trap = Trap::new().await;
    let home = common::home();
    let file = planted_config(home.path(), &trap);
    let env = vec![(
        "AGENT_RELAY_HOME".to_string(),
        home.path().display().to_string(),
    )];
    for bits in [0o666, 0o620, 0o602] {
        set_mode(&file, bits);
        assert_commands_refuse(
            &env,
            None,
            &file,
            &format!("can be written by other users (mode {bits:04o})"),
            &format!("run `chmod 600 {}`", file.display()),
        )
        .await;
    }
    assert_eq!(trap.hits(), 0, "the planted api_url was contacted");

    // The control: the same file, private, is used, so the trap works.
    set_mode(&file, 0o600);
    let doctor = run(&["doctor"], &env, None).await;
    assert!(trap.hits() > 0, "{:?}", doctor);
}

#[tokio::test]
async fn a_config_of_another_uid_is_refused_by_doctor_and_status_and_its_api_url_hears_nothing() {
    if skip_unless_root("running doctor as another uid") {
        return;
    }
    let (victim, other) = uids();
    let trap = Trap::new().await;
    let home = home_of(Some(victim));
    let file = planted_config(home.path(), &trap);
    chown(&home.path().join("config"), victim);
    set_mode(&file, 0o644);
    let env = vec![(
        "AGENT_RELAY_HOME".to_string(),
        home.path().display().to_string(),
    )];
    for owner in [other, 0] {
        chown(&file, owner);
        assert_commands_refuse(
            &env,
            Some(victim),
            &file,
            &format!("is owned by uid {owner}, not you (uid {victim})"),
            "remove it and write your own (it may have been planted by another user)",
        )
        .await;
    }
    assert_eq!(trap.hits(), 0, "the planted api_url was contacted");
    chown(&file, victim);
    run(&["doctor"], &env, Some(victim)).await;
    assert!(
        trap.hits() > 0,
        "the control: a config of the victim's own is used"
    );
}

#[tokio::test]
async fn symlinked_directories_are_refused() {
    let trap = Trap::new().await;
    let elsewhere = common::home();
    let planted = planted_config(elsewhere.path(), &trap);
    set_mode(&planted, 0o600);

    // config/ is a link to a directory with a config in it.
    let home = common::home();
    let link = home.path().join("config");
    std::os::unix::fs::symlink(elsewhere.path().join("config"), &link).expect("symlink");
    let env = vec![(
        "AGENT_RELAY_HOME".to_string(),
        home.path().display().to_string(),
    )];
    assert_commands_refuse(
        &env,
        None,
        &link,
        "is a symbolic link",
        "replace it with a directory of your own, or set AGENT_RELAY_HOME to a directory you own",
    )
    .await;
    assert_eq!(trap.hits(), 0, "the config behind the link was used");

    // The home itself is a link.
    let alias = common::home();
    let home_link = alias.path().join("home");
    std::os::unix::fs::symlink(elsewhere.path(), &home_link).expect("symlink");
    let env = vec![(
        "AGENT_RELAY_HOME".to_string(),
        home_link.display().to_string(),
    )];
    let doctor = run(&["doctor"], &env, None).await;
    let stdout = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        stdout.contains(&format!("{} is a symbolic link", home_link.display())),
        "{stdout}"
    );
    assert_eq!(trap.hits(), 0);

    // run/ is a link: the sidecar does not join a bus through it.
    let fake = common::fake().await;
    let home = common::home();
    let real_run = common::home();
    let run_link = home.path().join("run");
    std::os::unix::fs::symlink(real_run.path(), &run_link).expect("symlink");
    let mut env = configured(&fake);
    env.push(("AGENT_RELAY_HOME".into(), home.path().display().to_string()));
    let mut sidecar = Sidecar::spawn(&env, None, None);
    assert_refuses(&mut sidecar, &run_link, "is a symbolic link").await;
    assert!(
        std::fs::read_dir(real_run.path())
            .expect("read the link's target")
            .next()
            .is_none(),
        "nothing was created through the link"
    );
}

#[tokio::test]
async fn a_private_home_works_for_every_command() {
    // As a second uid when we can (the usual case: not root), else as us.
    let uid = root().then(|| uids().0);
    let fake = common::fake().await;
    let home = home_of(uid);
    let mut env = configured(&fake);
    env.push(("AGENT_RELAY_HOME".into(), home.path().display().to_string()));
    let mut sidecar = Sidecar::spawn(&env, uid, None);
    sidecar.handshake("mine").await;
    assert!(
        sidecar.wait_status(connected).await.ends_with("● leader"),
        "{:?}",
        sidecar.stderr()
    );
    let status = run(&["status"], &env, uid).await;
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && stdout.contains("1 session(s)"),
        "{status:?}"
    );
    let doctor = run(&["doctor"], &env, uid).await;
    let stdout = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.status.success() && stdout.ends_with("all checks passed\n"),
        "{stdout}"
    );
}

#[tokio::test]
async fn the_relays_files_are_private_whatever_the_umask() {
    let fake = common::fake().await;
    let home = common::home();
    let mut env = configured(&fake);
    env.push(("AGENT_RELAY_HOME".into(), home.path().display().to_string()));
    let mut sidecar = Sidecar::spawn(&env, None, Some(0));
    sidecar.handshake("umask").await;
    sidecar.wait_status(connected).await;
    let bus = home.path().join("run").join(BOT);
    let state = home.path().join("state");
    let logs = state.join("logs");
    // The log file is written in the background: wait for it.
    let deadline = tokio::time::Instant::now() + WAIT;
    while std::fs::read_dir(&logs).map_or(0, |d| d.count()) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no log file");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for dir in [
        home.path().join("config"),
        state.clone(),
        logs.clone(),
        home.path().join("run"),
        bus.clone(),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    let mut files = vec![
        bus.join("bus.lock"),
        bus.join("leader.json"),
        bus.join("bus.sock"),
        state.join(format!("{BOT}.sqlite3")),
    ];
    for sibling in ["-wal", "-shm"] {
        let file = state.join(format!("{BOT}.sqlite3{sibling}"));
        if file.exists() {
            files.push(file);
        }
    }
    for entry in std::fs::read_dir(&logs).expect("log dir") {
        files.push(entry.expect("entry").path());
    }
    for file in files {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
}

/// Resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test]
async fn a_host_that_never_reads_stdout_cannot_grow_the_sidecar() {
    const TOTAL: usize = 60_000;
    let home = common::home();
    let env = vec![(
        "AGENT_RELAY_HOME".to_string(),
        home.path().display().to_string(),
    )];
    let mut command = command(&["stdio"], &env, None, None);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = command.spawn().expect("spawn");
    let pid = child.id().expect("running");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib(pid);

    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let written = Arc::clone(&written);
        tokio::spawn(async move {
            for id in 1..=TOTAL {
                let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"x/nope\"}}\n");
                if stdin.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
                written.store(id, Ordering::Relaxed);
            }
        })
    };
    // Nobody reads: the sidecar must stop taking requests.
    let deadline = tokio::time::Instant::now() + WAIT;
    let (mut last, mut streak) = (0, 0);
    while streak < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sidecar kept reading: {} requests",
            written.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = written.load(Ordering::Relaxed);
        streak = if now == last { streak + 1 } else { 0 };
        last = now;
    }
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("stalled after {last} of {TOTAL} requests; resident memory grew {grown} KiB");
    assert!(last < TOTAL, "every request was taken without a reader");
    assert!(grown < 24 * 1024, "grew {grown} KiB");

    // The host reads again: every request gets its answer.
    let mut lines = BufReader::new(stdout).lines();
    let mut answered = 0;
    while answered < TOTAL {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("answers keep coming")
            .expect("read")
            .expect("output open");
        let value: Value = serde_json::from_str(&line).expect("JSON");
        if value.get("id").is_some() {
            answered += 1;
        }
    }
    tokio::time::timeout(WAIT, writer)
        .await
        .expect("all requests written")
        .expect("writer");
    let _ = child.start_kill();
}
