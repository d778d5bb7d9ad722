//! The chaos run on a real HA cluster (`scripts/chaos --patroni`): etcd, two PostgreSQL nodes
//! managed by Patroni (`synchronous_mode: true`) and HAProxy routing every new connection to the
//! leader by Patroni's REST check (`GET /primary`) — Debian's packages, on loopback, with ports
//! and a directory of their own, everything stopped and removed when the [`Cluster`] is dropped.
//!
//! The configuration is the repository's `deploy/patroni/node.yml`, `deploy/haproxy.cfg` and
//! `deploy/pgbouncer.ini`, with their placeholders in braces filled in (ports, directories).
//!
//! Three routes from oncely to the database ([`Route`]): through HAProxy; through PgBouncer in
//! transaction mode in front of HAProxy; and a multi-host URL with
//! `target_session_attrs=read-write`, no proxy. Three faults ([`Scenario`]), each made once half
//! of a storm is answered: the leader's postmaster SIGKILLed, the leader node (Patroni and its
//! PostgreSQL) SIGKILLed, and a switchover (`patronictl switchover --force`).
//!
//! Everything runs as the `postgres` user when this process is root (PostgreSQL refuses root,
//! PgBouncer too), each daemon in a process group of its own (no terminal signal reaches it; the
//! drop stops it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde::Serialize;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::failover::{Binaries, processes_naming};

/// `deploy/patroni/node.yml`: one node's Patroni configuration.
pub const NODE_TEMPLATE: &str = include_str!("../../../deploy/patroni/node.yml");
/// `deploy/haproxy.cfg`: HAProxy routing to the leader by Patroni's REST check.
pub const HAPROXY_TEMPLATE: &str = include_str!("../../../deploy/haproxy.cfg");
/// `deploy/pgbouncer.ini`: PgBouncer in transaction mode in front of HAProxy.
pub const PGBOUNCER_TEMPLATE: &str = include_str!("../../../deploy/pgbouncer.ini");

/// The Debian packages the run needs, and the program each provides.
pub const PACKAGES: [(&str, &str); 5] = [
    ("patroni", "patroni"),
    ("patronictl", "patroni"),
    ("etcd", "etcd-server"),
    ("haproxy", "haproxy"),
    ("pgbouncer", "pgbouncer"),
];

/// How oncely reaches the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// `DATABASE_URL` is HAProxy's port.
    Haproxy,
    /// `DATABASE_URL` is PgBouncer's port (transaction mode, in front of HAProxy), with
    /// `ONCELY_DATABASE_POOLER=transaction` and `ONCELY_DATABASE_DIRECT_URL` = HAProxy's URL.
    Pgbouncer,
    /// `DATABASE_URL` names both nodes, `target_session_attrs=read-write`: no proxy.
    Multihost,
}

/// The fault made once half the storm is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The leader's postmaster SIGKILLed (its backends die with it); Patroni restarts it or
    /// fails over.
    KillPostgres,
    /// The leader node SIGKILLed: its Patroni and every process of its PostgreSQL at once; the
    /// standby takes over once the leader key expires. The node's Patroni is started again after
    /// the failover and rejoins as a replica.
    KillNode,
    /// `patronictl switchover --leader <leader> --candidate <standby> --force`.
    Switchover,
}

impl Scenario {
    /// All three, in the order the run makes them.
    pub const ALL: [Self; 3] = [Self::KillPostgres, Self::KillNode, Self::Switchover];
}

/// What one fault took, as the cluster saw it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultReport {
    /// `kill-postgres`, `kill-node` or `switchover`.
    pub scenario: String,
    /// `haproxy`, `pgbouncer` or `multihost`.
    pub route: String,
    /// Faults made (1 once the storm passed its middle).
    pub faults: u64,
    /// The leader before the fault.
    pub leader_before: String,
    /// The leader once a connection through HAProxy accepted writes again.
    pub leader_after: String,
    /// `sync_state` of the standby as the leader reported it before the storm (`sync`).
    pub sync_state_before: String,
    /// From the fault to a new connection through HAProxy that accepts writes, in seconds.
    pub writable_after_s: f64,
    /// Intents of the storm answered when the fault was made.
    pub answered_at_fault: u64,
    /// Intents of the storm answered when a connection through HAProxy accepted writes again:
    /// short of the storm's intents, or the storm did not outlast the fault and its figures do
    /// not cover it.
    pub answered_at_writable: u64,
}

/// The programs the cluster runs.
#[derive(Debug, Clone)]
struct Tools {
    postgres: Binaries,
    patroni: PathBuf,
    patronictl: PathBuf,
    etcd: PathBuf,
    haproxy: PathBuf,
    pgbouncer: PathBuf,
    /// Whom to run them as (uid, gid): `postgres` when this process is root.
    user: Option<(u32, u32)>,
}

impl Tools {
    fn find() -> anyhow::Result<Self> {
        let postgres = Binaries::find()?;
        let mut missing = Vec::new();
        let mut found = |program: &str| -> PathBuf {
            let path = which(program);
            if path.is_none() {
                let package = PACKAGES
                    .iter()
                    .find(|(p, _)| *p == program)
                    .map_or(program, |(_, package)| package);
                missing.push(format!("{program} (package {package})"));
            }
            path.unwrap_or_default()
        };
        let tools = Self {
            patroni: found("patroni"),
            patronictl: found("patronictl"),
            etcd: found("etcd"),
            haproxy: found("haproxy"),
            pgbouncer: found("pgbouncer"),
            user: postgres.user(),
            postgres,
        };
        ensure!(missing.is_empty(), "not installed: {}", missing.join(", "));
        if crate::failover::running_as_root() {
            ensure!(
                tools.user.is_some(),
                "running as root, and there is no postgres user to run the cluster as"
            );
        }
        Ok(tools)
    }
}

/// Why the cluster cannot run here (a program missing), or `None`.
pub fn missing() -> Option<String> {
    Tools::find().err().map(|error| format!("{error:#}"))
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// One Patroni node.
#[derive(Debug)]
struct Node {
    name: String,
    pg_port: u16,
    rest_port: u16,
    config: PathBuf,
    data: PathBuf,
    patroni: Mutex<Option<std::process::Child>>,
}

impl Node {
    fn postmaster(&self) -> anyhow::Result<u32> {
        let pidfile = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .with_context(|| format!("{} has no postmaster.pid", self.name))?;
        pidfile
            .lines()
            .next()
            .and_then(|pid| pid.trim().parse().ok())
            .context("postmaster.pid has no pid")
    }
}

/// The member list of Patroni's `GET /cluster`.
#[derive(Debug, serde::Deserialize)]
struct Members {
    members: Vec<Member>,
}

#[derive(Debug, serde::Deserialize)]
struct Member {
    name: String,
    role: String,
    state: String,
}

/// etcd, two Patroni nodes, HAProxy and (for the PgBouncer route) PgBouncer; stopped and
/// removed when dropped.
#[derive(Debug)]
pub struct Cluster {
    tools: Tools,
    route: Route,
    work: tempfile::TempDir,
    logs: Option<PathBuf>,
    nodes: [Node; 2],
    haproxy_port: u16,
    pgbouncer_port: u16,
    daemons: Mutex<Vec<std::process::Child>>,
    http: reqwest::Client,
}

impl Cluster {
    /// Starts the cluster for `route` and waits until it has a leader, a synchronous standby
    /// and HAProxy routes to the leader. The daemons' logs are copied into `logs` when it stops.
    pub async fn start(route: Route, logs: Option<&Path>) -> anyhow::Result<Self> {
        // reqwest is built without a default TLS crypto provider (the REST checks are plain
        // HTTP, but the client wants one).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tools = Tools::find()?;
        let work = tempfile::Builder::new()
            .prefix("oncely-patroni-")
            .tempdir()?;
        let [
            pg1,
            pg2,
            rest1,
            rest2,
            etcd,
            etcd_peer,
            haproxy_port,
            pgbouncer_port,
        ] = free_ports::<8>()?;
        let dir = work.path().to_str().context("work path")?.to_owned();
        let node = |name: &str, pg_port: u16, rest_port: u16| Node {
            name: name.to_owned(),
            pg_port,
            rest_port,
            config: work.path().join(format!("{name}.yml")),
            data: work.path().join(name).join("data"),
            patroni: Mutex::new(None),
        };
        let nodes = [node("node1", pg1, rest1), node("node2", pg2, rest2)];
        let bin_dir = tools.postgres.dir().to_str().context("bin dir")?.to_owned();
        for n in &nodes {
            std::fs::create_dir_all(work.path().join(&n.name))?;
            let config = fill(
                NODE_TEMPLATE,
                &[
                    ("name", &n.name),
                    ("rest_port", &n.rest_port.to_string()),
                    ("etcd_port", &etcd.to_string()),
                    ("pg_port", &n.pg_port.to_string()),
                    ("dir", &dir),
                    ("bin_dir", &bin_dir),
                ],
            )?;
            std::fs::write(&n.config, config)?;
        }
        let haproxy_cfg = fill(
            HAPROXY_TEMPLATE,
            &[
                ("port", &haproxy_port.to_string()),
                ("name1", &nodes[0].name),
                ("name2", &nodes[1].name),
                ("pg_port1", &pg1.to_string()),
                ("pg_port2", &pg2.to_string()),
                ("rest_port1", &rest1.to_string()),
                ("rest_port2", &rest2.to_string()),
            ],
        )?;
        std::fs::write(work.path().join("haproxy.cfg"), haproxy_cfg)?;
        let pgbouncer_ini = fill(
            PGBOUNCER_TEMPLATE,
            &[
                ("port", &pgbouncer_port.to_string()),
                ("haproxy_port", &haproxy_port.to_string()),
                ("dir", &dir),
            ],
        )?;
        std::fs::write(work.path().join("pgbouncer.ini"), pgbouncer_ini)?;
        std::fs::write(work.path().join("userlist.txt"), "\"postgres\" \"\"\n")?;
        if let Some((uid, gid)) = tools.user {
            chown_tree(work.path(), uid, gid)?;
        }
        let cluster = Self {
            tools,
            route,
            logs: logs.map(Path::to_path_buf),
            nodes,
            haproxy_port,
            pgbouncer_port,
            daemons: Mutex::new(Vec::new()),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()?,
            work,
        };
        let etcd_url = format!("http://127.0.0.1:{etcd}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_data = format!("{dir}/etcd");
        let etcd_cluster = format!("chaos={peer_url}");
        cluster.daemon(
            "etcd",
            &cluster.tools.etcd,
            &[
                "--name",
                "chaos",
                "--data-dir",
                &etcd_data,
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &etcd_cluster,
            ],
        )?;
        cluster
            .wait("etcd to answer", Duration::from_secs(30), || async {
                cluster
                    .http
                    .get(format!("{etcd_url}/health"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
            .await?;
        // The first node bootstraps the cluster; the second, started once it leads, copies it.
        cluster.start_patroni(&cluster.nodes[0])?;
        cluster
            .wait("node1 to lead", Duration::from_secs(60), || async {
                cluster
                    .members()
                    .await
                    .is_some_and(|m| m.iter().any(|m| m.role == "leader" && m.state == "running"))
            })
            .await?;
        cluster.start_patroni(&cluster.nodes[1])?;
        let haproxy_cfg = format!("{dir}/haproxy.cfg");
        cluster.daemon(
            "haproxy",
            &cluster.tools.haproxy,
            &["-db", "-f", &haproxy_cfg],
        )?;
        if route == Route::Pgbouncer {
            let ini = format!("{dir}/pgbouncer.ini");
            cluster.daemon("pgbouncer-out", &cluster.tools.pgbouncer, &[&ini])?;
        }
        cluster.settle().await?;
        Ok(cluster)
    }

    /// Starts `program args…` as the cluster's user, in a process group of its own, logging to
    /// `<work>/<name>.log`.
    fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[&str],
    ) -> anyhow::Result<std::process::Child> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.work.path().join(format!("{name}.log")))?;
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .current_dir(self.work.path())
            .env("HOME", self.work.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if let Some((uid, gid)) = self.tools.user {
            command.uid(uid).gid(gid);
        }
        command
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))
    }

    fn daemon(&self, name: &str, program: &Path, args: &[&str]) -> anyhow::Result<()> {
        let child = self.spawn(name, program, args)?;
        self.daemons.lock().unwrap().push(child);
        Ok(())
    }

    fn start_patroni(&self, node: &Node) -> anyhow::Result<()> {
        let config = node.config.to_str().context("config path")?;
        let child = self.spawn(&node.name, &self.tools.patroni, &[config])?;
        *node.patroni.lock().unwrap() = Some(child);
        Ok(())
    }

    async fn wait<F, Fut>(&self, what: &str, within: Duration, mut done: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + within;
        while !done().await {
            ensure!(
                Instant::now() < deadline,
                "the Patroni cluster: waited {within:?} for {what} (logs in {})",
                self.logs.as_deref().unwrap_or(self.work.path()).display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// The members as any node's REST API sees them (`None`: no node answered).
    async fn members(&self) -> Option<Vec<Member>> {
        for node in &self.nodes {
            let url = format!("http://127.0.0.1:{}/cluster", node.rest_port);
            if let Ok(answer) = self.http.get(url).send().await
                && let Ok(members) = answer.json::<Members>().await
            {
                return Some(members.members);
            }
        }
        None
    }

    /// The running leader's name, if there is one.
    async fn leader(&self) -> Option<String> {
        self.members()
            .await?
            .into_iter()
            .find_map(|m| (m.role == "leader" && m.state == "running").then_some(m.name))
    }

    /// Waits (up to 3 minutes) until the cluster is settled: a running leader, the other node
    /// running as its synchronous standby and streaming (`sync_state = 'sync'` on the leader),
    /// and a new connection through HAProxy reaching the leader. Returns the leader's name.
    pub async fn settle(&self) -> anyhow::Result<String> {
        self.wait(
            "a leader and a streaming synchronous standby",
            Duration::from_secs(180),
            || async {
                let Some(members) = self.members().await else {
                    return false;
                };
                let running = |role: &str| {
                    members
                        .iter()
                        .any(|m| m.role == role && m.state == "running")
                };
                running("leader")
                    && running("sync_standby")
                    && self.sync_state().await.as_deref() == Some("sync")
            },
        )
        .await?;
        self.leader().await.context("no leader")
    }

    /// Through HAProxy: the standby's `sync_state` if the connection reaches a writable leader.
    async fn sync_state(&self) -> Option<String> {
        let connect = PgConnection::connect(&self.direct_url("postgres"));
        let mut conn = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .ok()?
            .ok()?;
        let state: Option<(bool, Option<String>)> = sqlx::query_as(
            "SELECT pg_is_in_recovery(), \
             (SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming' \
              ORDER BY sync_state = 'sync' DESC LIMIT 1)",
        )
        .fetch_optional(&mut conn)
        .await
        .ok()?;
        let _ = conn.close().await;
        match state {
            Some((false, state)) => state,
            _ => None,
        }
    }

    /// Whether a new connection through HAProxy accepts writes now.
    async fn writable(&self) -> bool {
        let connect = PgConnection::connect(&self.direct_url("postgres"));
        let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
            return false;
        };
        let in_recovery: Result<bool, _> = tokio::time::timeout(
            Duration::from_secs(1),
            sqlx::query_scalar("SELECT pg_is_in_recovery()").fetch_one(&mut conn),
        )
        .await
        .unwrap_or(Ok(true));
        let _ = conn.close().await;
        in_recovery.is_ok_and(|r| !r)
    }

    /// The route's URL of `database` for oncely (`DATABASE_URL`).
    pub fn url(&self, database: &str) -> String {
        match self.route {
            Route::Haproxy => self.direct_url(database),
            Route::Pgbouncer => {
                format!(
                    "postgres://postgres@127.0.0.1:{}/{database}",
                    self.pgbouncer_port
                )
            }
            Route::Multihost => format!(
                "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}\
                 ?target_session_attrs=read-write",
                self.nodes[0].pg_port, self.nodes[1].pg_port
            ),
        }
    }

    /// HAProxy's URL of `database`: the leader, whatever the route (the run's own audit;
    /// `ONCELY_DATABASE_DIRECT_URL` behind PgBouncer).
    pub fn direct_url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.haproxy_port
        )
    }

    /// The settings oncely's processes get besides `DATABASE_URL` on this route.
    pub fn env(&self, database: &str) -> Vec<(String, String)> {
        match self.route {
            Route::Pgbouncer => vec![
                (
                    "ONCELY_DATABASE_POOLER".to_owned(),
                    "transaction".to_owned(),
                ),
                (
                    "ONCELY_DATABASE_DIRECT_URL".to_owned(),
                    self.direct_url(database),
                ),
            ],
            Route::Haproxy | Route::Multihost => Vec::new(),
        }
    }

    /// The cluster's directory (its configuration, data and logs; removed when it stops).
    pub fn directory(&self) -> &Path {
        self.work.path()
    }

    /// The route.
    pub fn route(&self) -> Route {
        self.route
    }

    /// Creates `database` on the leader.
    pub async fn create_database(&self, database: &str) -> anyhow::Result<()> {
        crate::failover::create_database(&self.direct_url("postgres"), database).await
    }

    fn node(&self, name: &str) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// Makes `scenario`'s fault on the settled cluster and waits until a new connection through
    /// HAProxy accepts writes again (up to 2 minutes); after a killed node, starts its Patroni
    /// again (it rejoins as a replica; [`Cluster::settle`] waits for that).
    pub async fn fault(
        &self,
        scenario: Scenario,
        report: &mut FaultReport,
        answered: impl Fn() -> u64,
    ) -> anyhow::Result<()> {
        let leader_name = self.leader().await.context("no leader before the fault")?;
        let leader = self.node(&leader_name)?;
        let standby = self
            .nodes
            .iter()
            .find(|n| n.name != leader_name)
            .context("no standby")?;
        report.leader_before = leader_name.clone();
        let started = Instant::now();
        match scenario {
            Scenario::KillPostgres => {
                let postmaster = leader.postmaster()?;
                signal(postmaster, rustix::process::Signal::KILL)?;
                eprintln!("chaos: patroni: SIGKILLed {leader_name}'s postmaster ({postmaster})");
            }
            Scenario::KillNode => {
                let postmaster = leader.postmaster()?;
                // The postmaster stopped first, so that it forks no child after its children
                // are listed; then Patroni and all of PostgreSQL killed.
                signal(postmaster, rustix::process::Signal::STOP)?;
                let mut victims = vec![postmaster];
                victims.extend(crate::failover::children(postmaster));
                if let Some(patroni) = leader.patroni.lock().unwrap().as_mut() {
                    let _ = patroni.kill();
                    let _ = patroni.wait();
                }
                for &pid in &victims {
                    signal(pid, rustix::process::Signal::KILL)?;
                }
                eprintln!(
                    "chaos: patroni: SIGKILLed {leader_name}'s Patroni and its {} PostgreSQL processes",
                    victims.len()
                );
            }
            Scenario::Switchover => {
                let output = tokio::process::Command::new(&self.tools.patronictl)
                    .arg("-c")
                    .arg(&leader.config)
                    .args(["switchover", "--leader", &leader_name, "--candidate"])
                    .arg(&standby.name)
                    .arg("--force")
                    .env("HOME", self.work.path())
                    .stdin(Stdio::null())
                    .output()
                    .await
                    .context("cannot run patronictl")?;
                ensure!(
                    output.status.success(),
                    "patronictl switchover failed: {}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                eprintln!(
                    "chaos: patroni: switched over from {leader_name} to {}",
                    standby.name
                );
            }
        }
        // Writable again through HAProxy: the first new connection that reaches a leader (the
        // same one, its postmaster restarted by Patroni, or the other).
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.wait(
            "a writable leader after the fault",
            Duration::from_secs(120),
            || self.writable(),
        )
        .await?;
        report.writable_after_s = started.elapsed().as_secs_f64();
        report.answered_at_writable = answered();
        report.leader_after = self.leader().await.unwrap_or_default();
        report.faults += 1;
        eprintln!(
            "chaos: patroni: writable again after {:.1} s, leader {}",
            report.writable_after_s, report.leader_after
        );
        if scenario == Scenario::KillNode {
            // The killed node comes back: its Patroni again, with the data it had.
            let pidfile = leader.data.join("postmaster.pid");
            let _ = std::fs::remove_file(pidfile);
            self.start_patroni(leader)?;
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Patroni first, so that nothing starts PostgreSQL again; then PostgreSQL, then the rest.
        for node in &self.nodes {
            if let Some(mut patroni) = node.patroni.lock().unwrap().take() {
                kill_group(&patroni);
                let _ = patroni.wait();
            }
        }
        for node in &self.nodes {
            if node.data.join("postmaster.pid").exists() {
                let _ = self
                    .tools
                    .postgres
                    .command("pg_ctl")
                    .args(["-m", "immediate", "-D"])
                    .arg(&node.data)
                    .arg("stop")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for mut daemon in self.daemons.lock().unwrap().drain(..) {
            kill_group(&daemon);
            let _ = daemon.wait();
        }
        // Whatever else of the cluster still runs names the work directory on its command line
        // (a postmaster `pg_ctl` could not stop, a `pg_rewind`, a `pg_basebackup`).
        let work = self.work.path().to_string_lossy().into_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = processes_naming(&work);
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in left {
                let _ = signal(pid, rustix::process::Signal::KILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(logs) = &self.logs {
            let _ = std::fs::create_dir_all(logs);
            for name in [
                "etcd",
                "node1",
                "node2",
                "haproxy",
                "pgbouncer-out",
                "pgbouncer",
            ] {
                let _ = std::fs::copy(
                    self.work.path().join(format!("{name}.log")),
                    logs.join(format!("cluster-{name}.log")),
                );
            }
        }
        for _ in 0..40 {
            if std::fs::remove_dir_all(self.work.path()).is_ok() || !self.work.path().exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The fault of one scenario on a cluster, made by the monkey once half the storm is answered.
#[derive(Debug)]
pub struct Fault {
    cluster: std::sync::Arc<Cluster>,
    scenario: Scenario,
    report: tokio::sync::Mutex<FaultReport>,
}

impl Fault {
    /// `scenario` on `cluster`; `sync_state` as the settled cluster reported it.
    pub async fn new(cluster: std::sync::Arc<Cluster>, scenario: Scenario) -> anyhow::Result<Self> {
        let sync_state = cluster.sync_state().await.unwrap_or_default();
        let scenario_name = serde_json::to_value(scenario)?
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let route = serde_json::to_value(cluster.route())?
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Ok(Self {
            cluster,
            scenario,
            report: tokio::sync::Mutex::new(FaultReport {
                scenario: scenario_name,
                route,
                sync_state_before: sync_state,
                ..FaultReport::default()
            }),
        })
    }

    /// Makes the fault (see [`Cluster::fault`]); `answered` counts the storm's answers.
    pub async fn make(&self, answered: &std::sync::atomic::AtomicU64) -> anyhow::Result<()> {
        use std::sync::atomic::Ordering;
        let mut report = self.report.lock().await;
        report.answered_at_fault = answered.load(Ordering::Relaxed);
        self.cluster
            .fault(self.scenario, &mut report, || {
                answered.load(Ordering::Relaxed)
            })
            .await
    }

    /// What it took so far.
    pub fn report(&self) -> FaultReport {
        self.report
            .try_lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }
}

fn signal(pid: u32, signal: rustix::process::Signal) -> anyhow::Result<()> {
    let pid = rustix::process::Pid::from_raw(pid as i32).context("a pid of 0")?;
    match rustix::process::kill_process(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(error) => bail!("cannot signal {pid:?}: {error}"),
    }
}

/// SIGKILLs the process group `child` leads (it was started with a group of its own).
fn kill_group(child: &std::process::Child) {
    if let Some(group) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
}

/// `template` with every `{name}` replaced; fails on a placeholder left unfilled.
fn fill(template: &str, values: &[(&str, &str)]) -> anyhow::Result<String> {
    let mut text = template.to_owned();
    for (name, value) in values {
        text = text.replace(&format!("{{{name}}}"), value);
    }
    for (start, _) in text.match_indices('{') {
        let name: String = text[start + 1..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() && text[start + 1 + name.len()..].starts_with('}') {
            bail!("a placeholder left unfilled: {{{name}}}");
        }
    }
    Ok(text)
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .with_context(|| format!("cannot give {} to postgres", path.display()))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// `N` ports free now, all different (each held until all are found).
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_fill_completely() {
        let node = fill(
            NODE_TEMPLATE,
            &[
                ("name", "n"),
                ("rest_port", "1"),
                ("etcd_port", "2"),
                ("pg_port", "3"),
                ("dir", "/d"),
                ("bin_dir", "/b"),
            ],
        )
        .unwrap();
        assert!(node.contains("synchronous_mode: true"));
        assert!(fill(NODE_TEMPLATE, &[("name", "n")]).is_err());
        let haproxy = fill(
            HAPROXY_TEMPLATE,
            &[
                ("port", "1"),
                ("name1", "a"),
                ("name2", "b"),
                ("pg_port1", "2"),
                ("pg_port2", "3"),
                ("rest_port1", "4"),
                ("rest_port2", "5"),
            ],
        )
        .unwrap();
        assert!(haproxy.contains("option httpchk GET /primary"));
        assert!(haproxy.contains("on-marked-down shutdown-sessions"));
        let pgbouncer = fill(
            PGBOUNCER_TEMPLATE,
            &[("port", "1"), ("haproxy_port", "2"), ("dir", "/d")],
        )
        .unwrap();
        assert!(pgbouncer.contains("pool_mode = transaction"));
    }
}
