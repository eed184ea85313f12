//! Real `nats-server -js` processes for the cluster tests: each on loopback,
//! on a free port, with its store in a temporary directory, killed when
//! dropped. Without the binary the tests skip with a printed reason, except
//! under CI (`CI` set), where `.ci/run` installs it and a missing one fails.
//! Shared by `tests/cluster.rs` and `tests/cluster_relay.rs`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to say it is ready.
const READY: Duration = Duration::from_secs(20);

/// The binary, or why there is none (then the caller skips).
pub fn binary() -> Option<PathBuf> {
    let candidates = std::env::var_os("NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nats-server"))
                .collect::<Vec<_>>()
        }))
        .chain(["/usr/sbin/nats-server", "/usr/bin/nats-server"].map(PathBuf::from));
    for candidate in candidates {
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    let why = "nats-server is not installed (apt-get install nats-server, or set NATS_SERVER)";
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}: CI must run the cluster tests (.ci/run installs it)"
    );
    eprintln!("skipping: {why}");
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One `nats-server -js` process.
pub struct NatsServer {
    binary: PathBuf,
    pub name: String,
    pub port: u16,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl NatsServer {
    /// A single server with JetStream in `dir`.
    pub fn start(binary: &Path, dir: &Path) -> NatsServer {
        let port = free_port();
        let mut server = NatsServer::new(binary, dir, "solo", port, Vec::new());
        server.spawn();
        server
    }

    /// A single server with JetStream and extra arguments (`-c FILE`).
    pub fn start_with(binary: &Path, dir: &Path, extra: Vec<String>) -> NatsServer {
        let port = free_port();
        let mut server = NatsServer::new(binary, dir, "solo", port, extra);
        server.spawn();
        server
    }

    fn new(binary: &Path, dir: &Path, name: &str, port: u16, extra: Vec<String>) -> NatsServer {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("server dir");
        let mut args: Vec<String> = [
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            name,
            "-sd",
            &dir.join("store").display().to_string(),
            "-l",
            &dir.join("log").display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra);
        NatsServer {
            binary: binary.to_path_buf(),
            name: name.to_string(),
            port,
            args,
            dir,
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Starts the process and waits until it says it is ready.
    fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("log"));
        let child = Command::new(&self.binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let start = Instant::now();
        while !self.log().contains("Server is ready") {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "nats-server {} exited with {status}:\n{}",
                    self.name,
                    self.log()
                );
            }
            assert!(
                start.elapsed() < READY,
                "nats-server {} not ready within {READY:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: nothing is flushed on the way out.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three servers routed into one JetStream cluster on loopback.
pub fn start_cluster(binary: &Path, dir: &Path) -> Vec<NatsServer> {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let routes = ports
        .iter()
        .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut servers: Vec<NatsServer> = ports
        .iter()
        .enumerate()
        .map(|(i, (client, cluster))| {
            NatsServer::new(
                binary,
                dir,
                &format!("n{i}"),
                *client,
                vec![
                    "--cluster_name".into(),
                    "relaytest".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{cluster}"),
                    "--routes".into(),
                    routes.clone(),
                ],
            )
        })
        .collect();
    // Started together: each waits for its peers before JetStream is ready.
    for server in &mut servers {
        let child = Command::new(&server.binary)
            .args(&server.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        server.child = Some(child);
    }
    let start = Instant::now();
    while !servers.iter().all(|s| s.log().contains("Server is ready")) {
        assert!(
            start.elapsed() < READY,
            "the NATS cluster was not ready within {READY:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    servers
}
