//! A RESP connection's session (protocol version, authentication, name, an
//! open MULTI) and the answer to each command.
//!
//! Invariants:
//! - every command gets exactly one reply, in order (EXEC's is one array
//!   of its commands' replies);
//! - until the connection is authenticated (when the server has client
//!   tokens) only AUTH, HELLO, QUIT and RESET are answered; the rest get
//!   NOAUTH and touch nothing; the [`MAX_WRONG_TOKENS`]th wrong token
//!   (AUTH, HELLO AUTH) is answered WRONGPASS and closes the connection,
//!   as QUIT does (later commands get no reply); every refusal for a
//!   missing or wrong token counts in `tollgate_auth_failures_total`;
//! - every command that touches the counters is first admitted by the
//!   node, as a CHECK frame is: a standby answers writes (and reads,
//!   unless it serves stale reads) with READONLY naming its primary; in
//!   cluster mode every key's slot is screened first (MOVED to the owner's
//!   RESP address, TRYAGAIN while it moves) and a refused command touches
//!   nothing; in a MULTI a refused command is refused when queued;
//! - a MULTI holds at most `--max-batch` commands and
//!   `--resp-max-multi-bytes` bytes, drawn from `--max-connection-memory`
//!   (multi.rs); EXEC runs them in order, each admitted on its own
//!   (Tollgate has no cross-key transactions: a MULTI is a batch, as a
//!   pipeline is).

use super::cluster;
use super::context::{key_error, Ctx};
use super::counter::{counter, incr};
use super::multi::Multi;
use super::parse::Args;
use super::reply::Reply;
use super::table::{self, Cmd, Spec, SCRIPTING, TABLE};
use super::throttle::Throttle;
use crate::node::Refusal;
use crate::server::frontend::on_port;
use crate::server::Shared;
use bytes::{Bytes, BytesMut};
use tollgate_protocol::Role;

/// Redis's version the front end answers like (HELLO, INFO): the commands
/// it knows behave as in this version.
pub(super) const REDIS_VERSION: &str = "7.2.0";

/// One connection's state.
#[derive(Debug)]
pub(super) struct Session {
    pub resp3: bool,
    pub authenticated: bool,
    pub name: Option<Bytes>,
    /// Set by QUIT: close once the replies are written.
    pub quit: bool,
    id: u64,
    multi: Option<Multi>,
    /// Wrong tokens given on this connection (kept across RESET).
    wrong_tokens: u32,
}

/// Wrong tokens (AUTH, HELLO AUTH) one connection may give: the last is
/// answered WRONGPASS and the connection closed, so tokens cannot be
/// guessed one after another on one connection.
pub(super) const MAX_WRONG_TOKENS: u32 = 3;

impl Session {
    pub fn new(shared: &Shared, id: u64) -> Self {
        Self {
            resp3: false,
            // No client token configured: nothing to prove.
            authenticated: shared.auth.hello(b"").is_some(),
            name: None,
            quit: false,
            id,
            multi: None,
            wrong_tokens: 0,
        }
    }

    /// Whether an open MULTI holds any of the connection memory budget.
    pub fn holds_budget(&self) -> bool {
        self.multi.as_ref().is_some_and(Multi::holds_budget)
    }

    /// Answers every command of `batch` into `buf`.
    pub fn run(&mut self, ctx: &Ctx, batch: &[Args], buf: &mut BytesMut) {
        for i in 0..batch.len() {
            if self.quit {
                return;
            }
            // An empty command (`*0`, a blank line) is ignored, as Redis does.
            if batch[i].is_empty() {
                continue;
            }
            let mut reply = Reply {
                buf: &mut *buf,
                resp3: self.resp3,
            };
            self.one(ctx, &batch[i], &batch[i + 1..], &mut reply);
        }
    }

    /// One command, with the commands after it in its batch (where
    /// INCR looks for the EXPIRE that gives its window).
    fn one(&mut self, ctx: &Ctx, args: &Args, later: &[Args], reply: &mut Reply) {
        let metrics = &ctx.shared.metrics.frontends;
        let Some((index, spec)) = table::lookup(&args[0]) else {
            metrics.resp_other.inc();
            return self.unknown(args, reply);
        };
        metrics.resp_commands[index].inc();
        if !self.authenticated
            && !matches!(spec.cmd, Cmd::Auth | Cmd::Hello | Cmd::Quit | Cmd::Reset)
        {
            count_auth_failure(ctx);
            return reply.error("NOAUTH Authentication required.");
        }
        if !spec.fits(args.len()) {
            if let Some(m) = &mut self.multi {
                m.abort();
            }
            return reply.error(&format!(
                "ERR wrong number of arguments for '{}' command",
                spec.name
            ));
        }
        if let Some(m) = &mut self.multi {
            if !matches!(
                spec.cmd,
                Cmd::Exec | Cmd::Discard | Cmd::Multi | Cmd::Quit | Cmd::Reset
            ) {
                // Refused now as Redis refuses it (a key of another node's
                // slot, a standby), so EXEC answers EXECABORT; EXEC asks again.
                if let Err(e) = admitted(ctx, spec, args) {
                    m.abort();
                    return reply.error(&e);
                }
                let max_commands = usize::from(ctx.shared.limits.max_batch);
                let max_bytes = ctx.shared.frontends.resp_max_multi_bytes;
                return match m.queue(args, max_commands, max_bytes) {
                    Ok(()) => reply.simple("QUEUED"),
                    Err(e) => reply.error(&e.to_string()),
                };
            }
        }
        self.execute(ctx, spec, args, later, reply);
    }

    fn execute(&mut self, ctx: &Ctx, spec: &Spec, args: &Args, later: &[Args], reply: &mut Reply) {
        if let Err(e) = admitted(ctx, spec, args) {
            return reply.error(&e);
        }
        let arg = |i: usize| -> &[u8] { &args[i] };
        match spec.cmd {
            Cmd::Ping => match args.len() {
                1 => reply.simple("PONG"),
                _ => reply.bulk(arg(1)),
            },
            Cmd::Echo => reply.bulk(arg(1)),
            Cmd::Hello => self.hello(ctx, &args[1..], reply),
            Cmd::Auth => self.auth(ctx, &args[1..], reply),
            Cmd::Quit => {
                self.quit = true;
                reply.simple("OK");
            }
            Cmd::Reset => {
                let wrong_tokens = self.wrong_tokens;
                *self = Self::new(ctx.shared, self.id);
                self.wrong_tokens = wrong_tokens;
                reply.resp3 = false;
                reply.simple("RESET");
            }
            Cmd::Client => self.client(&args[1..], reply),
            Cmd::Command => command(&args[1..], reply),
            Cmd::Select => match arg(1) {
                b"0" => reply.simple("OK"),
                _ => reply.error("ERR DB index is out of range"),
            },
            // Clients read settings at connect (redis-benchmark's `save`,
            // `appendonly`): Tollgate has none of Redis's.
            Cmd::Config => match String::from_utf8_lossy(arg(1))
                .to_ascii_uppercase()
                .as_str()
            {
                "GET" => reply.map(0),
                sub => reply.error(&format!("ERR CONFIG {sub} is not supported by Tollgate")),
            },
            Cmd::Info => reply.bulk(info(ctx).as_bytes()),
            Cmd::Multi => match &self.multi {
                Some(_) => reply.error("ERR MULTI calls can not be nested"),
                None => {
                    self.multi = Some(Multi::new(ctx.shared.budget.clone()));
                    reply.simple("OK");
                }
            },
            Cmd::Exec => self.exec(ctx, reply),
            Cmd::Discard => match self.multi.take() {
                Some(_) => reply.simple("OK"),
                None => reply.error("ERR DISCARD without MULTI"),
            },
            Cmd::Throttle => throttle(ctx, args, reply),
            Cmd::Incr | Cmd::IncrBy => incr(ctx, spec.cmd, args, later, reply),
            Cmd::Expire
            | Cmd::PExpire
            | Cmd::Get
            | Cmd::Ttl
            | Cmd::PTtl
            | Cmd::Del
            | Cmd::Exists => counter(ctx, spec.cmd, args, reply),
            Cmd::Cluster => cluster::cluster(ctx, &args[1..], reply),
            Cmd::ReadOnly | Cmd::ReadWrite => reply.simple("OK"),
        }
    }

    fn exec(&mut self, ctx: &Ctx, reply: &mut Reply) {
        let Some(multi) = self.multi.take() else {
            return reply.error("ERR EXEC without MULTI");
        };
        let Some(queued) = multi.commands() else {
            return reply.error("EXECABORT Transaction discarded because of previous errors.");
        };
        reply.array(queued.len());
        for (i, args) in queued.iter().enumerate() {
            self.one(ctx, args, &queued[i + 1..], reply);
        }
    }

    /// HELLO [protover [AUTH username password] [SETNAME name]].
    fn hello(&mut self, ctx: &Ctx, args: &[Bytes], reply: &mut Reply) {
        let mut version = if self.resp3 { 3 } else { 2 };
        let mut rest = args;
        if let Some(v) = args.first() {
            version = match &v[..] {
                b"2" => 2,
                b"3" => 3,
                _ => return reply.error("NOPROTO unsupported protocol version"),
            };
            rest = &args[1..];
        }
        let mut name = None;
        while let Some(option) = rest.first() {
            let option = option.to_ascii_uppercase();
            match (&option[..], rest.len()) {
                (b"AUTH", 3..) => {
                    if ctx.shared.auth.hello(&rest[2]).is_none() {
                        return self.wrong_token(ctx, reply);
                    }
                    self.authenticated = true;
                    rest = &rest[3..];
                }
                (b"SETNAME", 2..) => {
                    name = Some(rest[1].clone());
                    rest = &rest[2..];
                }
                _ => {
                    return reply.error(&format!(
                        "ERR syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(&option)
                    ))
                }
            }
        }
        if !self.authenticated {
            count_auth_failure(ctx);
            return reply.error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            );
        }
        if name.is_some() {
            self.name = name;
        }
        self.resp3 = version == 3;
        reply.resp3 = self.resp3;
        let role = match ctx.shared.engine.node().greeting().role {
            Role::Primary => "master",
            Role::Standby => "replica",
        };
        reply.map(7);
        reply.entry_str("server", "tollgate");
        reply.entry_str("version", REDIS_VERSION);
        reply.entry_int("proto", version);
        reply.entry_int("id", self.id as i64);
        reply.entry_str("mode", "standalone");
        reply.entry_str("role", role);
        reply.bulk(b"modules");
        reply.array(0);
    }

    /// AUTH [username] password: the username is not checked (Tollgate
    /// has one kind of client); the password is a client token. Without
    /// client tokens any password passes, except in the one-argument form,
    /// which Redis refuses then (a client configured with a password the
    /// server does not have).
    fn auth(&mut self, ctx: &Ctx, args: &[Bytes], reply: &mut Reply) {
        if args.len() > 2 {
            return reply.error("ERR syntax error");
        }
        let open = ctx.shared.auth.hello(b"").is_some();
        if open && args.len() == 1 {
            return reply.error(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            );
        }
        let password = &args[args.len() - 1];
        if ctx.shared.auth.hello(password).is_none() {
            return self.wrong_token(ctx, reply);
        }
        self.authenticated = true;
        reply.simple("OK");
    }

    /// A wrong token: WRONGPASS, counted; the [`MAX_WRONG_TOKENS`]th
    /// closes the connection once the reply is written.
    fn wrong_token(&mut self, ctx: &Ctx, reply: &mut Reply) {
        count_auth_failure(ctx);
        self.wrong_tokens += 1;
        reply.error(WRONGPASS);
        if self.wrong_tokens >= MAX_WRONG_TOKENS {
            self.quit = true;
        }
    }

    fn client(&mut self, args: &[Bytes], reply: &mut Reply) {
        let sub = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        match (sub.as_str(), args.len()) {
            ("SETNAME", 2) => {
                self.name = Some(args[1].clone());
                reply.simple("OK");
            }
            ("GETNAME", 1) => match &self.name {
                Some(n) => reply.bulk(n),
                None => reply.null(),
            },
            ("ID", 1) => reply.int(self.id as i64),
            // The library name and version clients announce at connect.
            ("SETINFO", 3) => reply.simple("OK"),
            _ => reply.error(&format!(
                "ERR unknown subcommand '{sub}'. Tollgate answers CLIENT SETNAME, GETNAME, ID \
                 and SETINFO"
            )),
        }
    }

    fn unknown(&mut self, args: &Args, reply: &mut Reply) {
        if let Some(m) = &mut self.multi {
            m.abort();
        }
        let name = String::from_utf8_lossy(&args[0]).into_owned();
        if SCRIPTING
            .iter()
            .any(|s| s.as_bytes().eq_ignore_ascii_case(name.as_bytes()))
        {
            return reply.error(&format!(
                "ERR unknown command '{name}': Tollgate runs no scripts; send CL.THROTTLE \
                 (redis-cell's token bucket) or INCR/EXPIRE counters instead"
            ));
        }
        let mut shown = String::new();
        for a in args.iter().skip(1).take(3) {
            shown.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
        }
        reply.error(&format!(
            "ERR unknown command '{name}', with args beginning with: {shown}"
        ));
    }
}

/// Counts a request refused for a missing or wrong token.
fn count_auth_failure(ctx: &Ctx) {
    let failures = &ctx.shared.metrics.frontends.auth_failures;
    failures.with_label_values(&["resp"]).inc();
}

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Whether the node serves a command that touches the counters here:
/// its access (a standby refuses writes), and in cluster mode every key's
/// slot (nothing is evaluated for a key another node owns). Err is the
/// error to answer.
fn admitted(ctx: &Ctx, spec: &Spec, args: &Args) -> Result<(), String> {
    let Some(access) = spec.access() else {
        return Ok(());
    };
    let gate = ctx
        .shared
        .engine
        .node()
        .admit(access)
        .map_err(|r| refused(&r, ctx.port))?;
    gate.screen_keys(spec.keys_of(args))
        .map_err(|r| refused(&r, ctx.port))
}

/// The RESP error for a node's refusal, as Redis words it: READONLY (a
/// standby, with its primary's RESP address) as a Redis replica answers
/// writes; MOVED (the slot's owner's RESP address) and TRYAGAIN as a Redis
/// Cluster node answers a key it does not serve.
pub(super) fn refused(refusal: &Refusal, port: u16) -> String {
    match refusal {
        Refusal::Moved { slot, addr, .. } => {
            // An IPv6 host unbracketed, as Redis writes it (clients split
            // at the last colon).
            let (host, port) = on_port(addr, port);
            format!("MOVED {slot} {host}:{port}")
        }
        Refusal::TryAgain(busy) => format!("TRYAGAIN {busy}"),
        Refusal::NotPrimary {
            primary: Some(p),
            epoch,
        } => {
            let (host, port) = on_port(p, port);
            format!(
                "READONLY You can't write against a read only replica: this Tollgate node is a \
                 standby of {p} (epoch {epoch}); its RESP front end is {host}:{port}"
            )
        }
        Refusal::NotPrimary { primary: None, .. } => {
            "READONLY You can't write against a read only replica: this Tollgate node is a \
             standby and knows no primary yet"
                .to_owned()
        }
        other => format!("ERR {other}"),
    }
}

fn throttle(ctx: &Ctx, args: &Args, reply: &mut Reply) {
    if let Some(e) = key_error(ctx, &args[1]) {
        return reply.error(&e);
    }
    let counters = &ctx.shared.metrics.frontends.resp;
    let max_log = ctx.shared.max_log_entries;
    let throttle = match Throttle::parse(&args[1..], max_log) {
        Ok(t) => t,
        Err(e) => return reply.error(&e.to_string()),
    };
    match throttle.run(ctx) {
        Ok(t) => {
            counters.count(Some(!t.limited));
            t.write(reply);
        }
        Err(code) => {
            counters.count(None);
            reply.error(&format!("ERR {code}"));
        }
    }
}

/// COMMAND [COUNT | DOCS | INFO name...]: the table, for clients that
/// route by key (redis-py's RedisCluster reads it at start).
fn command(args: &[Bytes], reply: &mut Reply) {
    let sub = args.first().map(|a| a.to_ascii_uppercase());
    match sub.as_deref() {
        None => {
            reply.array(TABLE.len());
            TABLE.iter().for_each(|s| s.describe(reply));
        }
        Some(b"COUNT") => reply.int(TABLE.len() as i64),
        Some(b"DOCS") => reply.map(0),
        Some(b"INFO") => {
            reply.array(args.len() - 1);
            for name in &args[1..] {
                match table::lookup(name) {
                    Some((_, s)) => s.describe(reply),
                    None => reply.null(),
                }
            }
        }
        Some(other) => reply.error(&format!(
            "ERR unknown subcommand '{}'. Tollgate answers COMMAND, COMMAND COUNT, DOCS and INFO",
            String::from_utf8_lossy(other)
        )),
    }
}

/// INFO: the sections clients look at (server, replication, cluster).
fn info(ctx: &Ctx) -> String {
    let status = ctx.shared.engine.node().status();
    let role = match status.role {
        Role::Primary => "master",
        Role::Standby => "slave",
    };
    format!(
        "# Server\r\nredis_version:{REDIS_VERSION}\r\ntollgate_version:{}\r\nredis_mode:standalone\r\n\
         tcp_port:{}\r\n\r\n# Replication\r\nrole:{role}\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n",
        env!("CARGO_PKG_VERSION"),
        ctx.port
    )
}
