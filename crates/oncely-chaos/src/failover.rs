//! Failover (`scripts/chaos --failover`): a primary and a streaming standby on this machine, two
//! clusters of their own (`initdb`, `pg_basebackup -R`), behind a TCP proxy that hands every new
//! connection to the one that accepts writes. Midway the primary is SIGKILLed (every process
//! of it at once) and the standby promoted; the `oncely` processes follow through the proxy.
//!
//! Why a proxy: `sqlx` (0.9) takes one host per connection string, with no multi-host list and
//! no `target_session_attrs=read-write`, so the driver cannot follow a promotion by itself. The
//! proxy does what libpq's `target_session_attrs=read-write` does: it asks every backend
//! `pg_is_in_recovery()` (every 100 ms, over a connection of its own) and connects each client
//! to the first that is not in recovery; while none is (between the kill and the promotion), a
//! new client waits up to 10 s for one. A connection to the old primary breaks with it.
//! HAProxy (Debian's) was the other candidate; its `pgsql-check` cannot tell a primary from a
//! standby (both answer), and its usual companion, a health endpoint such as Patroni's, is a
//! failover manager of its own: that is `--patroni` (`patroni.rs`), which replaces this
//! pair for failovers. The pair stays for what Patroni's `synchronous_mode` does not let the run
//! control: an asynchronous standby behind a link of a chosen round trip, cut at the kill — what
//! asynchronous replication loses.
//!
//! Synchronous replication (`synchronous_standby_names = 'standby'`, `synchronous_commit = on`):
//! the primary acknowledges a commit once the standby has flushed it, so the promoted standby
//! holds every commit a client was told about. Asynchronous (`synchronous_standby_names = ''`):
//! the primary acknowledges at once and the standby follows a few milliseconds behind; what it
//! had not received when the primary died is gone. The promoted standby runs alone (its own
//! `synchronous_standby_names` is empty: with no standby left, a synchronous setting would stop
//! every commit).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde::Serialize;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::task::JoinHandle;

/// How the standby is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Replication {
    /// A commit is acknowledged once the standby flushed it.
    Synchronous,
    /// A commit is acknowledged at once; the standby follows behind.
    Asynchronous,
}

/// What the failover took.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailoverReport {
    /// How the primary replicated, as its `pg_stat_replication.sync_state` said before the storm
    /// (`sync` or `async`).
    pub sync_state: String,
    /// The round-trip time the replication link added, in milliseconds.
    pub link_rtt_ms: u64,
    /// Failovers done (1 once the run passed its middle).
    pub failovers: u64,
    /// From the SIGKILL to the proxy seeing the promoted standby accept writes, in milliseconds.
    pub unavailable_ms: u64,
    /// WAL the primary had written and the standby had not flushed, at the last look before the
    /// kill (bytes; what asynchronous replication may lose).
    pub wal_behind_bytes_before_kill: i64,
}

/// The PostgreSQL server programs (`initdb`, `pg_ctl`, `pg_basebackup`) of one installation.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
    /// Whom to run them as (uid, gid): `postgres` when this process is root.
    user: Option<(u32, u32)>,
}

impl Binaries {
    /// `ONCELY_PG_BIN`, else the directory `initdb` on the `PATH` resolves to, else the newest
    /// `/usr/lib/postgresql/*/bin` (Debian's layout, where `initdb` is not on the `PATH`).
    pub fn find() -> anyhow::Result<Self> {
        let dir = Self::find_dir()?;
        Ok(Self {
            dir,
            user: running_as_root().then(postgres_user).flatten(),
        })
    }

    fn find_dir() -> anyhow::Result<PathBuf> {
        let has_all = |dir: &Path| {
            ["initdb", "pg_ctl", "pg_basebackup"]
                .iter()
                .all(|tool| dir.join(tool).is_file())
        };
        if let Some(dir) = std::env::var_os("ONCELY_PG_BIN") {
            let dir = PathBuf::from(dir);
            ensure!(
                has_all(&dir),
                "ONCELY_PG_BIN={} lacks initdb, pg_ctl or pg_basebackup",
                dir.display()
            );
            return Ok(dir);
        }
        let on_path = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .map(|dir| dir.join("initdb"))
            .find(|initdb| initdb.is_file())
            .and_then(|initdb| std::fs::canonicalize(initdb).ok())
            .and_then(|initdb| initdb.parent().map(Path::to_path_buf));
        let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path().join("bin"))
            .collect();
        debian.sort_by_key(|dir| {
            dir.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
        on_path
            .into_iter()
            .chain(debian.into_iter().rev())
            .find(|dir| has_all(dir))
            .context(
                "no PostgreSQL server programs (initdb, pg_ctl, pg_basebackup) found: install \
                 PostgreSQL or set ONCELY_PG_BIN to their directory",
            )
    }

    /// The directory of the programs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whom the programs run as (uid, gid): `postgres` when this process is root.
    pub fn user(&self) -> Option<(u32, u32)> {
        self.user
    }

    /// `tool args…`, as the `postgres` user when this process is root (PostgreSQL refuses to
    /// run as root) — the tool itself, no wrapper in between, so that killing it kills it.
    pub(crate) fn command(&self, tool: &str) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(self.dir.join(tool));
        command.current_dir("/");
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Runs `tool` to its end in a process group of its own; dropped before that (the pair's
    /// set-up cancelled), the whole group is killed — `initdb`'s bootstrap backend too, which
    /// would go on writing into a directory being removed.
    async fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        struct Group(Option<rustix::process::Pid>);
        impl Drop for Group {
            fn drop(&mut self) {
                if let Some(group) = self.0 {
                    let _ =
                        rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
                }
            }
        }
        let child = Command::from(self.command(tool))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {tool}"))?;
        let mut group = Group(
            child
                .id()
                .and_then(|pid| rustix::process::Pid::from_raw(pid as i32)),
        );
        let output = child.wait_with_output().await;
        group.0 = None;
        let output = output.with_context(|| format!("cannot run {tool}"))?;
        ensure!(
            output.status.success(),
            "{tool} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(())
    }
}

/// The `postgres` user's uid and gid (from `/etc/passwd`).
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"postgres") && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

pub(crate) fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// One cluster: its data directory and port.
#[derive(Debug)]
struct Cluster {
    data: PathBuf,
    port: u16,
}

impl Cluster {
    fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// The postmaster's pid, from `postmaster.pid`.
    fn postmaster(&self) -> anyhow::Result<u32> {
        let pidfile = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .context("the primary has no postmaster.pid")?;
        pidfile
            .lines()
            .next()
            .and_then(|pid| pid.trim().parse().ok())
            .context("postmaster.pid has no pid")
    }
}

/// The primary, the standby and the proxy in front of them; stopped when dropped.
#[derive(Debug)]
pub struct Pair {
    binaries: Binaries,
    work: tempfile::TempDir,
    logs: Option<PathBuf>,
    primary: Cluster,
    standby: Cluster,
    proxy: SocketAddr,
    proxy_tasks: Vec<JoinHandle<()>>,
    link: JoinHandle<()>,
    writable: Arc<AtomicUsize>,
    replication: Replication,
    report: std::sync::Mutex<FailoverReport>,
}

/// No backend accepts writes (the proxy's `writable`).
const NONE: usize = usize::MAX;

impl Pair {
    /// Creates and starts both clusters (the standby streaming from the primary, in the
    /// `replication` asked) and the proxy; the clusters' logs are copied into `logs` when the
    /// pair stops.
    ///
    /// The standby reaches the primary through a link in this process that holds each byte
    /// `link_rtt / 2` each way (0: passed on at once), as a standby in another zone or region
    /// would be; the failover cuts it first, and what was in flight is lost, as it is when the
    /// primary's machine or its network is gone.
    pub async fn start(
        replication: Replication,
        link_rtt: Duration,
        logs: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let binaries = Binaries::find()?;
        let work = tempfile::Builder::new()
            .prefix("oncely-failover-")
            .tempdir()?;
        if running_as_root() {
            let (uid, gid) = binaries
                .user
                .context("running as root, and there is no postgres user to run PostgreSQL as")?;
            std::os::unix::fs::chown(work.path(), Some(uid), Some(gid))
                .context("cannot give the work directory to postgres")?;
        }
        let [primary_port, standby_port] = free_ports()?;
        let primary = Cluster {
            data: work.path().join("primary"),
            port: primary_port,
        };
        let standby = Cluster {
            data: work.path().join("standby"),
            port: standby_port,
        };
        let proxy = TcpListener::bind("127.0.0.1:0").await?;
        let link = TcpListener::bind("127.0.0.1:0").await?;
        let link_port = link.local_addr()?.port();
        let link = tokio::spawn(replication_link(
            link,
            SocketAddr::from(([127, 0, 0, 1], primary.port)),
            link_rtt / 2,
        ));
        let mut pair = Self {
            binaries,
            logs: logs.map(Path::to_path_buf),
            primary,
            standby,
            proxy: proxy.local_addr()?,
            proxy_tasks: Vec::new(),
            link,
            writable: Arc::new(AtomicUsize::new(NONE)),
            replication,
            report: std::sync::Mutex::new(FailoverReport {
                link_rtt_ms: link_rtt.as_millis() as u64,
                ..FailoverReport::default()
            }),
            work,
        };
        pair.create(link_port).await?;
        let backends = [pair.primary.options(), pair.standby.options()];
        pair.proxy_tasks.push(tokio::spawn(probe(
            backends.to_vec(),
            pair.writable.clone(),
        )));
        let addrs = [pair.primary.port, pair.standby.port]
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
        pair.proxy_tasks.push(tokio::spawn(serve(
            proxy,
            addrs.to_vec(),
            pair.writable.clone(),
        )));
        let state = pair.wait_streaming().await?;
        pair.report.lock().unwrap().sync_state = state;
        Ok(pair)
    }

    async fn create(&self, link_port: u16) -> anyhow::Result<()> {
        let work = self.work.path();
        let primary = self.primary.data.to_str().context("work path")?;
        let standby = self.standby.data.to_str().context("work path")?;
        let sockets = work.to_str().context("work path")?;
        self.binaries
            .run(
                "initdb",
                &["-D", primary, "-U", "postgres", "--auth=trust", "--no-sync"],
            )
            .await?;
        let synchronous = match self.replication {
            Replication::Synchronous => "standby",
            Replication::Asynchronous => "",
        };
        let conf = format!(
            "\n# oncely-chaos --failover\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{sockets}'\n\
             max_connections = 200\n\
             wal_level = replica\n\
             max_wal_senders = 4\n\
             max_replication_slots = 4\n\
             synchronous_commit = on\n\
             synchronous_standby_names = '{synchronous}'\n",
            port = self.primary.port,
        );
        append(&self.primary.data.join("postgresql.conf"), &conf)?;
        self.binaries
            .run(
                "pg_ctl",
                &[
                    "-D",
                    primary,
                    "-l",
                    &format!("{sockets}/primary.log"),
                    "-w",
                    "start",
                ],
            )
            .await?;
        // The standby: a base backup that streams WAL through a slot of its own (nothing it
        // needs is recycled), with the connection settings to follow (`-R`).
        self.binaries
            .run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.primary.port.to_string(),
                    "-U",
                    "postgres",
                    "-D",
                    standby,
                    "-X",
                    "stream",
                    "-C",
                    "-S",
                    "standby",
                    "-R",
                ],
            )
            .await?;
        append(
            &self.standby.data.join("postgresql.auto.conf"),
            &format!(
                "port = {}\n\
                 primary_conninfo = 'host=127.0.0.1 port={link_port} user=postgres application_name=standby'\n\
                 synchronous_standby_names = ''\n",
                self.standby.port
            ),
        )?;
        self.binaries
            .run(
                "pg_ctl",
                &[
                    "-D",
                    standby,
                    "-l",
                    &format!("{sockets}/standby.log"),
                    "-w",
                    "start",
                ],
            )
            .await
    }

    /// Waits until the standby streams and the proxy hands out the primary; returns the
    /// standby's `sync_state` as the primary sees it.
    async fn wait_streaming(&self) -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut primary = PgConnection::connect_with(&self.primary.options()).await?;
        loop {
            let state: Option<String> = sqlx::query_scalar(
                "SELECT sync_state FROM pg_stat_replication \
                 WHERE application_name = 'standby' AND state = 'streaming'",
            )
            .fetch_optional(&mut primary)
            .await?;
            let expected = match self.replication {
                Replication::Synchronous => "sync",
                Replication::Asynchronous => "async",
            };
            if state.as_deref() == Some(expected) && self.writable.load(Ordering::Relaxed) == 0 {
                return Ok(expected.to_owned());
            }
            if Instant::now() > deadline {
                bail!("the standby did not start streaming ({state:?})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A URL of `database` through the proxy.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@{}/{database}", self.proxy)
    }

    /// Creates `database` on the primary (the standby receives it by replication).
    pub async fn create_database(&self, database: &str) -> anyhow::Result<()> {
        create_database(&self.url("postgres"), database).await
    }

    /// Cuts the replication link (what is in flight on it is lost), SIGKILLs every process of
    /// the primary, then promotes the standby and waits until the proxy hands it out.
    pub async fn fail_over(&self) -> anyhow::Result<()> {
        let behind = self.wal_behind().await.unwrap_or(-1);
        self.link.abort();
        let postmaster = self.primary.postmaster()?;
        let signal = |pid: u32, signal: rustix::process::Signal| -> anyhow::Result<()> {
            let pid = rustix::process::Pid::from_raw(pid as i32).context("a pid of 0")?;
            match rustix::process::kill_process(pid, signal) {
                // One that has exited in between is gone already.
                Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
                Err(error) => bail!("cannot signal the primary's process {pid:?}: {error}"),
            }
        };
        let killed = Instant::now();
        // The postmaster stopped first: it forks no child after its children are listed (one
        // forked in between would outlive the kill) and starts no crash recovery; then all of
        // them killed.
        signal(postmaster, rustix::process::Signal::STOP)?;
        let mut victims = vec![postmaster];
        victims.extend(children(postmaster));
        for &pid in &victims {
            signal(pid, rustix::process::Signal::KILL)?;
        }
        eprintln!(
            "chaos: failover: SIGKILLed the primary's {} processes, promoting the standby",
            victims.len()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while victims
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
        {
            ensure!(Instant::now() < deadline, "the primary's processes live on");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Its pid file names a pid the system may give another process: nothing may stop that
        // one for the dead primary (the pair's drop stops a cluster with a pid file).
        std::fs::remove_file(self.primary.data.join("postmaster.pid"))
            .context("cannot remove the dead primary's postmaster.pid")?;
        let standby = self.standby.data.to_str().context("work path")?;
        self.binaries
            .run("pg_ctl", &["-D", standby, "-w", "promote"])
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.writable.load(Ordering::Relaxed) != 1 {
            ensure!(
                Instant::now() < deadline,
                "the proxy never saw the promoted standby accept writes"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut report = self.report.lock().unwrap();
        report.failovers += 1;
        report.unavailable_ms = killed.elapsed().as_millis() as u64;
        report.wal_behind_bytes_before_kill = behind;
        Ok(())
    }

    /// How far the standby's flushed WAL is behind the primary's written WAL.
    async fn wal_behind(&self) -> anyhow::Result<i64> {
        let mut primary = PgConnection::connect_with(&self.primary.options()).await?;
        let behind: Option<i64> = sqlx::query_scalar(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint \
             FROM pg_stat_replication WHERE application_name = 'standby'",
        )
        .fetch_optional(&mut primary)
        .await?;
        Ok(behind.unwrap_or(-1))
    }

    /// What the failover took so far.
    pub fn report(&self) -> FailoverReport {
        self.report.lock().unwrap().clone()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for task in &self.proxy_tasks {
            task.abort();
        }
        self.link.abort();
        for cluster in [&self.primary, &self.standby] {
            if cluster.data.join("postmaster.pid").exists() {
                let _ = self
                    .binaries
                    .command("pg_ctl")
                    .args(["-m", "immediate", "-D"])
                    .arg(&cluster.data)
                    .arg("stop")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        // Whatever else of the pair's still runs — a postmaster that a cancelled `pg_ctl start`
        // forked, an `initdb` cut short — names the work directory on its command line.
        let work = self.work.path().to_string_lossy().into_owned();
        for pid in processes_naming(&work) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if let Some(logs) = &self.logs {
            for name in ["primary.log", "standby.log"] {
                let _ = std::fs::copy(self.work.path().join(name), logs.join(name));
            }
        }
        // A process killed a moment ago may still finish a write: retry the removal a while
        // (the directory's own drop gives up at the first error).
        for _ in 0..40 {
            if std::fs::remove_dir_all(self.work.path()).is_ok() || !self.work.path().exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Every 100 ms, asks each backend whether it is in recovery (over a connection kept for it)
/// and publishes the first one that is not in `writable` ([`NONE`] if none is).
async fn probe(backends: Vec<PgConnectOptions>, writable: Arc<AtomicUsize>) {
    let mut conns: Vec<Option<PgConnection>> = backends.iter().map(|_| None).collect();
    loop {
        let mut first = NONE;
        for (i, options) in backends.iter().enumerate() {
            if conns[i].is_none() {
                conns[i] = tokio::time::timeout(
                    Duration::from_secs(1),
                    PgConnection::connect_with(options),
                )
                .await
                .ok()
                .and_then(Result::ok);
            }
            let Some(conn) = conns[i].as_mut() else {
                continue;
            };
            let asked = tokio::time::timeout(
                Duration::from_secs(1),
                sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(conn),
            )
            .await;
            match asked {
                Ok(Ok(in_recovery)) => {
                    if !in_recovery && first == NONE {
                        first = i;
                    }
                }
                _ => conns[i] = None,
            }
        }
        writable.store(first, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Accepts clients and pipes each to the backend that accepts writes.
async fn serve(listener: TcpListener, backends: Vec<SocketAddr>, writable: Arc<AtomicUsize>) {
    while let Ok((client, _)) = listener.accept().await {
        tokio::spawn(pipe(client, backends.clone(), writable.clone()));
    }
}

/// Connects `client` to the backend that accepts writes (waiting up to 10 s for one: between a
/// primary's death and the promotion there is none), then copies both ways until either side
/// closes.
async fn pipe(mut client: TcpStream, backends: Vec<SocketAddr>, writable: Arc<AtomicUsize>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut server = loop {
        let i = writable.load(Ordering::Relaxed);
        if let Some(addr) = backends.get(i)
            && let Ok(server) = TcpStream::connect(addr).await
        {
            break server;
        }
        if Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// The replication link: every connection of the standby piped to the primary, each byte held
/// `one_way` in each direction. Aborting the task cuts every connection and drops what it held.
async fn replication_link(listener: TcpListener, primary: SocketAddr, one_way: Duration) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((standby, _)) = accepted else { return };
                conns.spawn(async move {
                    let Ok(primary) = TcpStream::connect(primary).await else { return };
                    let _ = standby.set_nodelay(true);
                    let _ = primary.set_nodelay(true);
                    let (from_standby, to_standby) = standby.into_split();
                    let (from_primary, to_primary) = primary.into_split();
                    tokio::join!(
                        held(from_standby, to_primary, one_way),
                        held(from_primary, to_standby, one_way)
                    );
                });
            }
            Some(_) = conns.join_next() => {}
        }
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn held(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (chunks, mut due) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || chunks
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// The pids of the processes whose command line contains `text` (from `/proc`).
pub fn processes_naming(text: &str) -> Vec<u32> {
    processes_whose("cmdline", |cmdline| {
        String::from_utf8_lossy(cmdline).contains(text)
    })
}

/// The pids whose parent is `pid` (from `/proc`).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    processes_whose("stat", |stat| {
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses; the last `)` ends it.
        let stat = String::from_utf8_lossy(stat);
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        parent == Some(pid)
    })
}

/// The pids of the processes whose `/proc/<pid>/<file>` satisfies `keep`.
fn processes_whose(file: &str, keep: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(content) = std::fs::read(entry.path().join(file))
            && keep(&content)
        {
            found.push(pid);
        }
    }
    found
}

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Two ports free now, and different: both are held at once while they are found (one freed
/// before the other is asked for can be handed out again).
fn free_ports() -> anyhow::Result<[u16; 2]> {
    let first = std::net::TcpListener::bind("127.0.0.1:0")?;
    let second = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok([first.local_addr()?.port(), second.local_addr()?.port()])
}

/// Creates `database` (lowercase letters, digits and `_` only) through `url`, a maintenance
/// database's URL.
pub(crate) async fn create_database(url: &str, database: &str) -> anyhow::Result<()> {
    ensure!(
        !database.is_empty()
            && database
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
        "a database name of lowercase letters, digits and _: {database:?}"
    );
    let mut conn = PgConnection::connect(url).await?;
    // The name is checked above: letters, digits and underscores only.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}
