//! Configuration: one struct per `config.toml` section.
//!
//! Precedence, lowest first: built-in defaults, the TOML file (`--config` or
//! `MUSTER_CONFIG`), environment variables `MUSTER_<SECTION>__<KEY>`, then the
//! command-line flags. Every section denies unknown keys, so a typo stops the
//! start with a message that names the key instead of being silently ignored.
//!
//! Durations are integers in milliseconds and their keys end in `_ms`: one
//! convention throughout.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

mod sections;
mod validate;

pub use self::validate::{MAX_ACK_CONNECTIONS, MAX_ACK_REPLICAS, MAX_ACK_TIMEOUT_MS, MAX_SHARDS};

pub use self::sections::{
    AuthConfig, BarriersConfig, ClaimConfig, EventsConfig, FailoverConfig, FailoverRole, LocksConfig, NodesConfig,
    OrphansConfig, RedisConfig, Role, SchedulesConfig, ServerConfig, TasksConfig, TelemetryConfig, TokenConfig,
};

/// Everything a node needs to start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub redis: RedisConfig,
    pub nodes: NodesConfig,
    pub auth: AuthConfig,
    pub tasks: TasksConfig,
    pub claim: ClaimConfig,
    pub orphans: OrphansConfig,
    pub events: EventsConfig,
    pub schedules: SchedulesConfig,
    pub barriers: BarriersConfig,
    pub locks: LocksConfig,
    pub failover: FailoverConfig,
    pub telemetry: TelemetryConfig,
}
/// Why a configuration was refused. The message names the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Loads defaults, then `file` (when given; it must exist), then the
    /// `MUSTER_<SECTION>__<KEY>` environment variables, and validates.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_then(file, |_| {})
    }

    /// Like [`Config::load`], with `flags` applied after the file and the
    /// environment and before the checks: command-line flags win, and a
    /// check that needs a flag's value (coordinated failover needs a node
    /// id, which `--node-id` may give) sees it (issue 36, N13).
    pub fn load_then(file: Option<&Path>, flags: impl FnOnce(&mut Config)) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist (given by --config or MUSTER_CONFIG)",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        fig = fig.merge(env_provider());
        let mut config: Config = fig.extract().map_err(|e| ConfigError(describe(e)))?;
        flags(&mut config);
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document over the defaults (no environment). Used by tests
    /// and by `load`'s checks.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError(describe(e)))?;
        config.validate()?;
        Ok(config)
    }
    /// The URL operators and peers use to reach this node.
    pub fn advertise_url(&self, bound: SocketAddr) -> String {
        if !self.server.advertise_url.is_empty() {
            return self.server.advertise_url.clone();
        }
        format!("http://{bound}")
    }
}

/// `MUSTER_<SECTION>__<KEY>`; variables without `__` (such as `MUSTER_CONFIG`
/// and `MUSTER_REDIS_SERVER_BIN`) are not configuration keys.
fn env_provider() -> Env {
    Env::prefixed("MUSTER_")
        .filter(|k| k.as_str().contains("__"))
        .split("__")
}

/// Figment's messages already name the key; make the wording uniform.
fn describe(e: figment::Error) -> String {
    let mut out = Vec::new();
    for err in e {
        let key = err.path.join(".");
        let what = match &err.kind {
            figment::error::Kind::UnknownField(field, _) => {
                // From a file the path ends at the section; from an
                // environment variable it already ends with the field.
                let full = if key.is_empty() {
                    field.clone()
                } else if err.path.last() == Some(field) {
                    key.clone()
                } else {
                    format!("{key}.{field}")
                };
                format!("unknown key `{full}`: check the spelling against config.toml")
            }
            _ => {
                let source = err
                    .metadata
                    .as_ref()
                    .map(|m| format!(" (from {})", m.name))
                    .unwrap_or_default();
                if key.is_empty() {
                    format!("{}{source}", err.kind)
                } else {
                    format!("invalid value for key `{key}`: {}{source}", err.kind)
                }
            }
        };
        out.push(what);
    }
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_config_parses_to_defaults() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
        let parsed = Config::from_toml(&text).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn flags_are_applied_before_the_checks() {
        // Issue 36, N13: `--node-id` satisfies coordinated failover's need
        // for a fixed node id, as `server.node_id` in the file does.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.toml");
        std::fs::write(
            &path,
            "[failover]\nrole = \"coordinator\"\nredis_servers = [\"127.0.0.1:1\"]\n\
             secret = \"0123456789abcdef0123\"\nclients = [\"fx\"]\n",
        )
        .unwrap();
        let e = Config::load(Some(&path)).unwrap_err();
        assert!(e.0.contains("server.node_id"), "{}", e.0);
        let cfg = Config::load_then(Some(&path), |c| c.server.node_id = "fc".into()).unwrap();
        assert_eq!(cfg.server.node_id, "fc");
        let e = Config::load_then(Some(&path), |c| c.server.node_id = "no spaces".into()).unwrap_err();
        assert!(e.0.contains("server.node_id"), "flags are checked too: {}", e.0);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::from_toml("[nodes]\nttl_msec = 5\n").unwrap_err();
        assert!(e.0.contains("nodes.ttl_msec"), "{}", e.0);
    }

    #[test]
    fn bad_value_is_named() {
        let e = Config::from_toml("[nodes]\nttl_ms = \"soon\"\n").unwrap_err();
        assert!(e.0.contains("nodes.ttl_ms"), "{}", e.0);
        let e = Config::from_toml("[server]\nlisten = \"nowhere\"\n").unwrap_err();
        assert!(e.0.contains("server.listen"), "{}", e.0);
        let e = Config::from_toml("[nodes]\nttl_ms = 3000\nheartbeat_ms = 1000\n").unwrap_err();
        assert!(e.0.contains("nodes.ttl_ms"), "{}", e.0);
        let c = Config::from_toml("[nodes]\nttl_ms = 2000\nheartbeat_ms = 500\n[redis]\ntimeout_ms = 2000\n").unwrap();
        assert!(c.warnings()[0].contains("redis.timeout_ms"), "{:?}", c.warnings());
        assert!(Config::default().warnings().is_empty());
        let e = Config::from_toml("[barriers]\nmax_open_rounds = 0\n").unwrap_err();
        assert!(e.0.contains("barriers.max_open_rounds"), "{}", e.0);
    }

    #[test]
    fn schedules_are_checked_at_load() {
        let ok = "[schedules]\nmax_skew_ms = 1000\n[[schedules.items]]\nid = \"nightly\"\nexpression = \"0 3 * * *\"\n\
                  timezone = \"Europe/Berlin\"\nqueue = \"reports\"\ntask = { payload = { kind = \"nightly\" }, priority = 5 }\n\
                  overlap = \"forbid\"\n";
        let cfg = Config::from_toml(ok).unwrap();
        assert_eq!(cfg.schedules.items[0].id, "nightly");
        assert_eq!(cfg.schedules.items[0].overlap, crate::schedules::Overlap::Forbid);
        let e = Config::from_toml(&ok.replace("Europe/Berlin", "Europe/Berlni")).unwrap_err();
        assert!(
            e.0.contains("schedules.items[0]") && e.0.contains("timezone"),
            "{}",
            e.0
        );
        let e = Config::from_toml(&ok.replace("0 3 * * *", "0 3 * *")).unwrap_err();
        assert!(
            e.0.contains("schedules.items[0]") && e.0.contains("expression"),
            "{}",
            e.0
        );
        let e = Config::from_toml(&ok.replace("overlap", "overlapp")).unwrap_err();
        assert!(e.0.contains("overlapp"), "{}", e.0);
        let e = Config::from_toml("[schedules]\nrecord_ttl_ms = 1000\n").unwrap_err();
        assert!(e.0.contains("schedules.record_ttl_ms"), "{}", e.0);
    }

    #[test]
    fn telemetry_keys_are_checked() {
        let ok = Config::from_toml(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 0.5\n\
             trace_url = \"http://j:16686/trace/{trace_id}\"\n",
        )
        .unwrap();
        assert_eq!(ok.telemetry.sample_ratio, 0.5);
        for (bad, key) in [
            ("otlp_endpoint = \"collector:4318\"", "telemetry.otlp_endpoint"),
            ("sample_ratio = 1.5", "telemetry.sample_ratio"),
            ("sample_ratio = -0.1", "telemetry.sample_ratio"),
            ("sample_ratio = nan", "telemetry.sample_ratio"),
            ("service_name = \"\"", "telemetry.service_name"),
            ("queue = 0", "telemetry.queue"),
            ("trace_url = \"http://j:16686/trace/\"", "telemetry.trace_url"),
        ] {
            let e = Config::from_toml(&format!("[telemetry]\n{bad}\n")).unwrap_err();
            assert!(e.0.contains(key), "{bad}: {}", e.0);
        }
    }

    #[test]
    fn durability_keys_are_bounded() {
        let url = "[redis]\nurl = \"redis://127.0.0.1:1\"\n";
        let ok = Config::from_toml(&format!("{url}ack_replicas = 2\nack_timeout_ms = 250\n")).unwrap();
        assert_eq!((ok.redis.ack_replicas, ok.redis.ack_timeout_ms), (2, 250));
        for (bad, key) in [
            ("ack_replicas = 17", "redis.ack_replicas"),
            ("ack_timeout_ms = 0", "redis.ack_timeout_ms"),
            ("ack_timeout_ms = 60001", "redis.ack_timeout_ms"),
            ("ack_connections = 0", "redis.ack_connections"),
            ("ack_connections = 257", "redis.ack_connections"),
            ("shards = 0", "redis.shards"),
            ("shards = 65", "redis.shards"),
        ] {
            let e = Config::from_toml(&format!("{url}{bad}\n")).unwrap_err();
            assert!(e.0.contains(key), "{bad}: {}", e.0);
        }
        // The embedded Redis has no replicas to wait for.
        let e = Config::from_toml("[redis]\nack_replicas = 1\n").unwrap_err();
        assert!(
            e.0.contains("redis.ack_replicas") && e.0.contains("embedded"),
            "{}",
            e.0
        );
    }

    #[test]
    fn runtime_threads_are_bounded_and_default_to_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto = Config::default();
        assert_eq!(auto.server.runtime_threads(), cores);
        let three = Config::from_toml("[server]\nworker_threads = 3\n").unwrap();
        assert_eq!(three.server.runtime_threads(), 3);
        let e = Config::from_toml("[server]\nworker_threads = 1025\n").unwrap_err();
        assert!(e.0.contains("server.worker_threads") && e.0.contains("1024"), "{}", e.0);
    }

    #[test]
    fn unknown_section_is_named() {
        let e = Config::from_toml("[nodez]\nttl_ms = 5\n").unwrap_err();
        assert!(e.0.contains("nodez"), "{}", e.0);
    }
}
