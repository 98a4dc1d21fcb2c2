//! The three-node cluster's launcher and its typed queries.
//!
//! `deploy/local/cluster.sh` starts, stops, signals and networks the nodes; everything the tests
//! ask about the cluster goes through Kafka's own metadata and admin API here: who leads a
//! partition, who coordinates a group or a transactional id, which members a group has, and the
//! ACLs the security tests grant. The kit chooses the script's parameters (base port, run dir,
//! network namespace), so it knows the addresses and files the script makes without reading its
//! output.
//!
//! Every test process asks for [`cluster`]; the first in a run starts the cluster, the others find
//! it running (`cluster.sh up` keeps a healthy cluster), and `deploy/local/test.sh` stops it at the
//! end. Tests that use it run one at a time (the `cluster` test group in `.config/nextest.toml`):
//! they crash and pause the nodes every one of them shares.

use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;

use crate::{client_config, repo_root, use_brokers};

/// Client port of node 1; node N's ports start at `BASE_PORT + 10 * (N - 1)`: PLAINTEXT, the
/// controller, SASL_SSL, and PLAINTEXT for the network namespace.
pub const BASE_PORT: u16 = 29092;
/// The network namespace `cluster.sh up` makes, where a worker can be cut off from one node.
pub const NETNS: &str = "dedupe-cluster-test";
/// The /24 it shares with the nodes: the nodes at .11, .12, .13, the namespace at .2.
pub const NETNS_SUBNET: &str = "10.213.0";
/// `offsets.topic.num.partitions` and `transaction.state.log.num.partitions` in cluster.sh.
pub const COORDINATOR_PARTITIONS: i32 = 8;
pub const NODES: [i32; 3] = [1, 2, 3];

/// Whether the long variants run (`DEDUPE_CLUSTER_LONG=1`): longer fault holds, more faults, and
/// the worker's default timeouts.
pub fn long() -> bool {
    std::env::var("DEDUPE_CLUSTER_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

pub struct Cluster {
    script: PathBuf,
    run_dir: PathBuf,
}

/// The cluster, started if it does not run, with the kit's helpers pointed at it.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let tmp = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let cluster = Cluster {
            script: repo_root().join("deploy/local/cluster.sh"),
            run_dir: tmp.join(format!("dedupe-cluster-{BASE_PORT}")),
        };
        cluster.run(&["up"]);
        use_brokers(&cluster.bootstrap());
        cluster
    })
}

fn port(node: i32, offset: u16) -> u16 {
    BASE_PORT + 10 * (node as u16 - 1) + offset
}

/// Java's `String.hashCode` (UTF-16 code units, wrapping), then Kafka's placement of a group or
/// a transactional id on its internal topic: `Utils.abs(hash) % partitions`, where `Utils.abs`
/// maps `i32::MIN` to 0. (Not `hash & 0x7fffffff`, Kafka's rule for record keys: the two differ
/// for every negative hash.)
pub fn coordinator_partition(id: &str, partitions: i32) -> i32 {
    let hash = id
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32));
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions
}

/// A resource an ACL names (AclCommand's `--topic`, `--group`, `--transactional-id`).
#[derive(Debug, Clone, Copy)]
pub enum Resource<'a> {
    Topic(&'a str),
    Group(&'a str),
    /// Every transactional id that starts with this prefix.
    TransactionalIdPrefix(&'a str),
}

/// An operation an ACL allows.
#[derive(Debug, Clone, Copy)]
pub enum Operation {
    Read,
    Write,
    Create,
    Describe,
    DescribeConfigs,
}

impl Cluster {
    /// Runs a verb of the cluster script with the kit's parameters; panics with its output if it
    /// fails.
    fn run(&self, args: &[&str]) {
        let out = Command::new("bash")
            .arg(&self.script)
            .args(args)
            .env("CLUSTER_BASE_PORT", BASE_PORT.to_string())
            .env("CLUSTER_RUN_DIR", &self.run_dir)
            .env("CLUSTER_NETNS", NETNS)
            .env("CLUSTER_NETNS_SUBNET", NETNS_SUBNET)
            .output()
            .expect("bash runs cluster.sh");
        assert!(
            out.status.success(),
            "cluster.sh {} failed:\n{}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn node(&self, verb: &str, node: i32) {
        let (t, at) = (Instant::now(), std::time::SystemTime::now());
        self.run(&[verb, &node.to_string()]);
        // The wall clock too, to read beside the worker's and the nodes' logs.
        eprintln!(
            "cluster.sh {verb} {node}: {:.1} s, from {}",
            t.elapsed().as_secs_f64(),
            humantime::format_rfc3339_millis(at)
        );
    }

    /// SIGKILL (a crash); returns once the process is gone.
    pub fn kill(&self, node: i32) {
        self.node("kill", node)
    }

    /// SIGTERM (a controlled shutdown); returns once it exited.
    pub fn stop(&self, node: i32) {
        self.node("stop", node)
    }

    /// Starts a node again on its data; returns once it lists itself among the brokers.
    pub fn start(&self, node: i32) {
        self.node("start", node)
    }

    /// SIGSTOP (a hang).
    pub fn pause(&self, node: i32) {
        self.node("pause", node)
    }

    pub fn resume(&self, node: i32) {
        self.node("resume", node)
    }

    /// Drops every packet from the network namespace to the node (connections hang).
    pub fn cut(&self, node: i32) {
        self.node("cut", node)
    }

    pub fn heal(&self, node: i32) {
        self.node("heal", node)
    }

    /// The PLAINTEXT bootstrap list on loopback.
    pub fn bootstrap(&self) -> String {
        NODES
            .iter()
            .map(|&n| format!("127.0.0.1:{}", port(n, 0)))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn metadata(&self, topic: Option<&str>) -> Option<Metadata> {
        let consumer: BaseConsumer = client_config().create().expect("metadata client");
        consumer.fetch_metadata(topic, Duration::from_secs(10)).ok()
    }

    /// The node that leads `partition` of `topic`, from the cluster's metadata.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let md = self.metadata(Some(topic))?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let p = t.partitions().iter().find(|p| p.id() == partition)?;
        (p.leader() >= 0).then_some(p.leader())
    }

    /// The transaction coordinator of `transactional_id`: the leader of its `__transaction_state`
    /// partition ([`coordinator_partition`]). rust-rdkafka has no FindCoordinator request.
    pub fn transaction_coordinator(&self, transactional_id: &str) -> Option<i32> {
        self.leader(
            "__transaction_state",
            coordinator_partition(transactional_id, COORDINATOR_PARTITIONS),
        )
    }

    /// The group coordinator of `group`: the leader of its `__consumer_offsets` partition.
    pub fn group_coordinator(&self, group: &str) -> Option<i32> {
        self.leader(
            "__consumer_offsets",
            coordinator_partition(group, COORDINATOR_PARTITIONS),
        )
    }

    /// The client ids of `group`'s members, as its coordinator describes them.
    pub fn group_members(&self, group: &str) -> Option<Vec<String>> {
        let consumer: BaseConsumer = client_config().create().expect("group list client");
        let list = consumer
            .fetch_group_list(Some(group), Duration::from_secs(10))
            .ok()?;
        let g = list.groups().iter().find(|g| g.name() == group)?;
        Some(
            g.members()
                .iter()
                .map(|m| m.client_id().to_string())
                .collect(),
        )
    }

    /// The KRaft controller the nodes last agreed on: the leader of the highest epoch among the
    /// nodes' `quorum-state` files (a paused or dead node's file is stale, never ahead). Kafka's
    /// metadata does not name it: in KRaft a broker reports a random live broker as controller.
    pub fn active_controller(&self) -> Option<i32> {
        NODES
            .iter()
            .filter_map(|n| {
                let file = self
                    .run_dir
                    .join(format!("node{n}/data/__cluster_metadata-0/quorum-state"));
                let state: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
                Some((state["leaderEpoch"].as_i64()?, state["leaderId"].as_i64()?))
            })
            .max()
            .and_then(|(_, leader)| i32::try_from(leader).ok().filter(|id| NODES.contains(id)))
    }

    /// Polls `find` until it names a node (a partition without a leader gets one within the
    /// brokers' session timeout, 9 s here).
    pub fn wait_for(&self, what: &str, find: impl Fn(&Self) -> Option<i32>) -> i32 {
        crate::wait_until(
            what,
            Duration::from_secs(90),
            Duration::from_millis(500),
            || find(self),
            || self.describe(),
        )
    }

    /// Waits until every partition of every topic has all its replicas in sync: a node killed and
    /// started again has caught up, so the next fault meets a whole cluster.
    pub fn wait_in_sync(&self) {
        crate::wait_until(
            "every replica in sync",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || {
                let md = self.metadata(None)?;
                md.topics()
                    .iter()
                    .flat_map(|t| t.partitions())
                    .all(|p| p.leader() >= 0 && p.isr().len() == p.replicas().len())
                    .then_some(())
            },
            || self.describe(),
        )
    }

    /// Waits until every one of `partitions` partitions of `topic` has a leader.
    pub fn wait_for_leaders(&self, topic: &str, partitions: i32) {
        crate::wait_until(
            &format!("a leader for every partition of {topic}"),
            Duration::from_secs(120),
            Duration::from_millis(500),
            || {
                (0..partitions)
                    .all(|p| self.leader(topic, p).is_some())
                    .then_some(())
            },
            || self.describe(),
        )
    }

    /// The brokers and partition leaders the metadata shows, for a failure message.
    pub fn describe(&self) -> String {
        let Some(md) = self.metadata(None) else {
            return "no node answered a metadata request within 10 s".into();
        };
        let mut brokers: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
        brokers.sort();
        let mut lines = vec![format!("brokers in metadata: {brokers:?}")];
        for t in md.topics() {
            let mut leaders: Vec<(i32, i32)> = t
                .partitions()
                .iter()
                .map(|p| (p.id(), p.leader()))
                .collect();
            leaders.sort();
            lines.push(format!(
                "{}: leaders (partition, node) {leaders:?}",
                t.name()
            ));
        }
        lines.join("\n")
    }

    /// How to reach the SASL_SSL listener.
    pub fn secure(&self) -> SecureListener {
        let tls = self.run_dir.join("tls");
        let password_file = tls.join("scram.password");
        let password = std::fs::read_to_string(&password_file).unwrap_or_else(|e| {
            panic!(
                "the SCRAM password cluster.sh made, {}: {e}",
                password_file.display()
            )
        });
        SecureListener {
            bootstrap: NODES
                .iter()
                .map(|&n| format!("127.0.0.1:{}", port(n, 2)))
                .collect::<Vec<_>>()
                .join(","),
            ca: tls.join("ca.pem"),
            worker_user: "dedupe".into(),
            client_user: "dedupe-client".into(),
            password: password.trim().to_string(),
        }
    }

    /// The network namespace: its name, its address, and the nodes' bootstrap list from there.
    pub fn netns(&self) -> Netns {
        Netns {
            name: NETNS.into(),
            address: format!("{NETNS_SUBNET}.2")
                .parse()
                .expect("an IPv4 address"),
            bootstrap: NODES
                .iter()
                .map(|&n| format!("{NETNS_SUBNET}.1{n}:{}", port(n, 3)))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Allows `principal` (`User:NAME`) `operations` on `resource`, through Kafka's CreateAcls
    /// (as `User:ANONYMOUS`, a super user, on the PLAINTEXT listener).
    pub fn allow(&self, principal: &str, operations: &[Operation], resource: Resource<'_>) {
        create_acls(principal, operations, resource)
            .unwrap_or_else(|e| panic!("CreateAcls for {principal} on {resource:?}: {e}"));
    }
}

/// CreateAcls through librdkafka's C API: rust-rdkafka 0.39 has no ACL calls.
fn create_acls(
    principal: &str,
    operations: &[Operation],
    resource: Resource<'_>,
) -> Result<(), String> {
    use rd::rd_kafka_AclOperation_t as Op;
    use rd::rd_kafka_ResourcePatternType_t as Pattern;
    use rd::rd_kafka_ResourceType_t as Type;
    let (kind, name, pattern) = match resource {
        Resource::Topic(t) => (
            Type::RD_KAFKA_RESOURCE_TOPIC,
            t,
            Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
        ),
        Resource::Group(g) => (
            Type::RD_KAFKA_RESOURCE_GROUP,
            g,
            Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
        ),
        Resource::TransactionalIdPrefix(p) => (
            Type::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
            p,
            Pattern::RD_KAFKA_RESOURCE_PATTERN_PREFIXED,
        ),
    };
    let (name, principal, host) = (
        CString::new(name).unwrap(),
        CString::new(principal).unwrap(),
        CString::new("*").unwrap(),
    );
    let client: BaseConsumer = client_config()
        .create()
        .map_err(|e| format!("admin client: {e}"))?;
    let rk = client.client().native_ptr();
    let mut bindings = Vec::new();
    for op in operations {
        let op = match op {
            Operation::Read => Op::RD_KAFKA_ACL_OPERATION_READ,
            Operation::Write => Op::RD_KAFKA_ACL_OPERATION_WRITE,
            Operation::Create => Op::RD_KAFKA_ACL_OPERATION_CREATE,
            Operation::Describe => Op::RD_KAFKA_ACL_OPERATION_DESCRIBE,
            Operation::DescribeConfigs => Op::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        };
        let mut errstr = [0 as std::ffi::c_char; 512];
        // SAFETY: every pointer is a live NUL-terminated string or the error buffer with its size.
        let binding = unsafe {
            rd::rd_kafka_AclBinding_new(
                kind,
                name.as_ptr(),
                pattern,
                principal.as_ptr(),
                host.as_ptr(),
                op,
                rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        };
        if binding.is_null() {
            // SAFETY: librdkafka wrote a NUL-terminated message into the buffer.
            return Err(unsafe { CStr::from_ptr(errstr.as_ptr()) }
                .to_string_lossy()
                .into_owned());
        }
        bindings.push(binding);
    }
    // SAFETY: `rk` outlives these calls (`client` is dropped at the end of the function); the
    // queue, the event and the bindings are destroyed once, after their last use; the result and
    // the per-ACL errors belong to the event.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        rd::rd_kafka_CreateAcls(
            rk,
            bindings.as_mut_ptr(),
            bindings.len(),
            std::ptr::null(),
            queue,
        );
        let event = rd::rd_kafka_queue_poll(queue, 30_000);
        let outcome = if event.is_null() {
            Err("no answer within 30 s".to_string())
        } else if rd::rd_kafka_event_error(event)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            Err(CStr::from_ptr(rd::rd_kafka_event_error_string(event))
                .to_string_lossy()
                .into_owned())
        } else {
            let result = rd::rd_kafka_event_CreateAcls_result(event);
            let mut n = 0;
            let acls = rd::rd_kafka_CreateAcls_result_acls(result, &mut n);
            let errors: Vec<String> = (0..n)
                .filter_map(|i| {
                    let error = rd::rd_kafka_acl_result_error(*acls.add(i));
                    (!error.is_null()).then(|| {
                        CStr::from_ptr(rd::rd_kafka_error_string(error))
                            .to_string_lossy()
                            .into_owned()
                    })
                })
                .collect();
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join("; "))
            }
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_queue_destroy(queue);
        for b in bindings {
            rd::rd_kafka_AclBinding_destroy(b);
        }
        outcome
    }
}

/// How to reach the cluster's SASL_SSL listener: SCRAM-SHA-512 over TLS with the CA `cluster.sh
/// up` made; both users have the same password.
pub struct SecureListener {
    pub bootstrap: String,
    pub ca: PathBuf,
    pub worker_user: String,
    pub client_user: String,
    pub password: String,
}

impl SecureListener {
    /// The environment that makes a `dedupe` command connect as `user` over SASL_SSL.
    pub fn env(&self, user: &str, password: &str) -> Vec<(String, String)> {
        vec![
            ("DEDUPE_KAFKA_BROKERS".into(), self.bootstrap.clone()),
            ("DEDUPE_KAFKA_SECURITY_PROTOCOL".into(), "sasl_ssl".into()),
            ("DEDUPE_KAFKA_SASL_MECHANISM".into(), "SCRAM-SHA-512".into()),
            ("DEDUPE_KAFKA_SASL_USERNAME".into(), user.into()),
            ("DEDUPE_KAFKA_SASL_PASSWORD".into(), password.into()),
            (
                "DEDUPE_KAFKA_SSL_CA_LOCATION".into(),
                self.ca.display().to_string(),
            ),
        ]
    }

    /// `spec` connecting as the worker's user through this listener.
    pub fn worker(&self, mut spec: crate::WorkerSpec) -> crate::WorkerSpec {
        spec.brokers = Some(self.bootstrap.clone());
        for (k, v) in self.env(&self.worker_user, &self.password) {
            spec = spec.env(&k, &v);
        }
        spec
    }
}

/// The network namespace joined to the nodes by a veth pair.
pub struct Netns {
    pub name: String,
    pub address: std::net::IpAddr,
    pub bootstrap: String,
}

#[cfg(test)]
mod tests {
    use super::coordinator_partition;

    #[test]
    fn ids_are_placed_as_kafka_places_them() {
        // Java: "".hashCode() == 0, "abc".hashCode() == 96354, "dedupe".hashCode() == -1335681465
        // (negative: Utils.abs, not a mask), and "polygenelubricants".hashCode() == Integer.MIN_VALUE,
        // which Utils.abs maps to 0.
        assert_eq!(coordinator_partition("", 8), 0);
        assert_eq!(coordinator_partition("abc", 8), 96354 % 8);
        assert_eq!(coordinator_partition("dedupe", 8), 1_335_681_465 % 8);
        assert_eq!(coordinator_partition("polygenelubricants", 8), 0);
        // A character outside the BMP counts as its two UTF-16 code units.
        assert_eq!(
            coordinator_partition("\u{1F600}", 50),
            (0xD83D * 31 + 0xDE00) % 50
        );
    }
}
