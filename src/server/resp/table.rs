//! The commands the RESP front end knows: their names, arity and key
//! positions (what `COMMAND` tells cluster clients such as redis-py's
//! RedisCluster, which route by the key's slot), and what each does to the
//! counters (the node admits it as a write or a read).

use super::reply::Reply;
use crate::node::Access;

/// A known command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cmd {
    Ping,
    Echo,
    Hello,
    Auth,
    Quit,
    Reset,
    Client,
    Command,
    Select,
    Config,
    Info,
    Multi,
    Exec,
    Discard,
    Throttle,
    Incr,
    IncrBy,
    Expire,
    PExpire,
    Get,
    Ttl,
    PTtl,
    Del,
    Exists,
    Cluster,
    ReadOnly,
    ReadWrite,
}

/// One row of the table: what `COMMAND` says of a command.
pub(super) struct Spec {
    pub name: &'static str,
    pub cmd: Cmd,
    /// Redis's arity: `n` exactly n arguments (the name included), `-n`
    /// at least n.
    pub arity: i64,
    pub flags: &'static [&'static str],
    /// Position of the first and last key (0: none; -1: the last
    /// argument) and the step between keys.
    pub keys: (i64, i64, i64),
}

const fn spec(
    name: &'static str,
    cmd: Cmd,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
) -> Spec {
    Spec {
        name,
        cmd,
        arity,
        flags,
        keys,
    }
}

const NONE: (i64, i64, i64) = (0, 0, 0);
const ONE: (i64, i64, i64) = (1, 1, 1);
const ALL: (i64, i64, i64) = (1, -1, 1);
const W: &[&str] = &["write", "fast"];
const R: &[&str] = &["readonly", "fast"];
const C: &[&str] = &["fast", "loading", "stale"];

/// Every command the front end answers, lowercase as `COMMAND` names them.
pub(super) const TABLE: &[Spec] = &[
    spec("ping", Cmd::Ping, -1, C, NONE),
    spec("echo", Cmd::Echo, 2, C, NONE),
    spec("hello", Cmd::Hello, -1, C, NONE),
    spec("auth", Cmd::Auth, -2, C, NONE),
    spec("quit", Cmd::Quit, -1, C, NONE),
    spec("reset", Cmd::Reset, 1, C, NONE),
    spec("client", Cmd::Client, -2, C, NONE),
    spec("command", Cmd::Command, -1, C, NONE),
    spec("select", Cmd::Select, 2, C, NONE),
    spec("config", Cmd::Config, -2, C, NONE),
    spec("info", Cmd::Info, -1, C, NONE),
    spec("multi", Cmd::Multi, 1, C, NONE),
    spec("exec", Cmd::Exec, 1, C, NONE),
    spec("discard", Cmd::Discard, 1, C, NONE),
    spec("cl.throttle", Cmd::Throttle, -5, W, ONE),
    spec("incr", Cmd::Incr, 2, W, ONE),
    spec("incrby", Cmd::IncrBy, 3, W, ONE),
    spec("expire", Cmd::Expire, -3, W, ONE),
    spec("pexpire", Cmd::PExpire, -3, W, ONE),
    spec("get", Cmd::Get, 2, R, ONE),
    spec("ttl", Cmd::Ttl, 2, R, ONE),
    spec("pttl", Cmd::PTtl, 2, R, ONE),
    spec("del", Cmd::Del, -2, W, ALL),
    spec("unlink", Cmd::Del, -2, W, ALL),
    spec("exists", Cmd::Exists, -2, R, ALL),
    spec("cluster", Cmd::Cluster, -2, C, NONE),
    spec("readonly", Cmd::ReadOnly, 1, C, NONE),
    spec("readwrite", Cmd::ReadWrite, 1, C, NONE),
];

/// Commands refused with a pointer to what to send instead: scripting
/// runs client code on the server, which Tollgate does not.
pub(super) const SCRIPTING: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "script",
    "fcall",
    "fcall_ro",
    "function",
];

/// The row of `name` (any case) and its index in [`TABLE`].
pub(super) fn lookup(name: &[u8]) -> Option<(usize, &'static Spec)> {
    TABLE
        .iter()
        .enumerate()
        .find(|(_, s)| s.name.as_bytes().eq_ignore_ascii_case(name))
}

impl Spec {
    /// Whether `argc` arguments (the name included) fit the arity.
    pub fn fits(&self, argc: usize) -> bool {
        let argc = argc as i64;
        if self.arity >= 0 {
            argc == self.arity
        } else {
            argc >= -self.arity
        }
    }

    /// What the command does to the counters, for the node's admission.
    pub fn access(&self) -> Option<Access> {
        if self.flags.contains(&"write") {
            Some(Access::Write)
        } else if self.flags.contains(&"readonly") {
            Some(Access::Read)
        } else {
            None
        }
    }

    /// The keys of `args` (the name at 0), by this row's key positions:
    /// what the node's slot gate screens (cluster mode).
    pub fn keys_of<'a>(&self, args: &'a [bytes::Bytes]) -> impl Iterator<Item = &'a [u8]> {
        let (first, last, step) = self.keys;
        // Inclusive; a negative position counts from the end.
        let end = if last < 0 {
            args.len() as i64 + last
        } else {
            last
        };
        let start = if first > 0 {
            first as usize
        } else {
            args.len()
        };
        args.iter()
            .enumerate()
            .skip(start)
            .take_while(move |&(i, _)| i as i64 <= end)
            .step_by(step.max(1) as usize)
            .map(|(_, k)| &k[..])
    }

    /// This row as `COMMAND` answers it: name, arity, flags, first key,
    /// last key, step, ACL categories, tips, key specifications,
    /// subcommands (the last four empty).
    pub fn describe(&self, reply: &mut Reply) {
        reply.array(10);
        reply.bulk(self.name.as_bytes());
        reply.int(self.arity);
        reply.array(self.flags.len());
        for flag in self.flags {
            reply.simple(flag);
        }
        reply.int(self.keys.0);
        reply.int(self.keys.1);
        reply.int(self.keys.2);
        for _ in 0..4 {
            reply.array(0);
        }
    }
}

/// The metric label of each row, in table order.
pub(crate) fn names() -> Vec<&'static str> {
    TABLE.iter().map(|s| s.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_ignores_case_and_arity_is_checked() {
        let (_, s) = lookup(b"Cl.Throttle").unwrap();
        assert_eq!(s.cmd, Cmd::Throttle);
        assert!(!s.fits(4));
        assert!(s.fits(5) && s.fits(6));
        let (_, incr) = lookup(b"INCR").unwrap();
        assert!(incr.fits(2) && !incr.fits(3));
        assert_eq!(incr.access(), Some(Access::Write));
        assert_eq!(lookup(b"TTL").unwrap().1.access(), Some(Access::Read));
        assert_eq!(lookup(b"PING").unwrap().1.access(), None);
        assert!(lookup(b"EVAL").is_none());
        let args: Vec<bytes::Bytes> = ["DEL", "a", "b", "c"].map(bytes::Bytes::from).to_vec();
        let keys: Vec<&[u8]> = lookup(b"DEL").unwrap().1.keys_of(&args).collect();
        assert_eq!(keys, [b"a", b"b", b"c"]);
        let keys: Vec<&[u8]> = lookup(b"INCR").unwrap().1.keys_of(&args[..2]).collect();
        assert_eq!(keys, [b"a"]);
        assert_eq!(lookup(b"PING").unwrap().1.keys_of(&args).count(), 0);
        // Names are unique, so COMMAND lists each once.
        let mut names = names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
    }
}
