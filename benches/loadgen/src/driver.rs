//! Runs one target: opens the connections, drives them closed or open loop,
//! shows progress, and merges what each connection recorded.
//!
//! ```text
//!  closed loop: per connection, keep `pipeline` requests in flight; each
//!               answer sends the next one. Latency = answer - send.
//!  open loop:   a pacer thread releases request k at start + k*interval
//!               (global, round robin over connections); a connection sends
//!               each released request as soon as it has a free pipeline
//!               slot. Latency = answer - intended send time, so a slow
//!               answer that delays later requests is charged to them too
//!               (no coordinated omission).
//! ```
//!
//! The pacer is an OS thread sleeping with `std::thread::sleep` (tens of µs
//! of slack) rather than a tokio timer, whose 1 ms granularity would add up
//! to a millisecond to every open-loop latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::Notify;

use crate::pipeline::Pipeline;
use crate::recorder::{Recorder, Window};
use crate::targets::{Connection, Target, TargetError};
use crate::workload::{KeyDistribution, KeyPicker, Schedule};

/// How to drive a target (the rest of the workload lives in the target's
/// [`RequestShape`](crate::targets::RequestShape)).
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub connections: u32,
    pub pipeline: u32,
    pub batch: u32,
    pub keys: u32,
    pub distribution: KeyDistribution,
    pub seed: u64,
    pub warmup: Duration,
    pub duration: Duration,
    /// Open loop: checks per second over all connections.
    pub rate: Option<f64>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Keep per-interval samples of this length (`--plot`).
    pub sample_every: Option<Duration>,
}

/// Checks answered by one connection, for the progress bar. Padded so two
/// connections on two cores do not share a cache line.
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicU64);

impl Counter {
    fn add(&self, n: u32) {
        // Relaxed: a statistic read by the progress bar only.
        self.0.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Runs `target` under `plan`; returns the merged recorder and the window
/// it covers.
pub async fn run<T: Target>(target: Arc<T>, plan: Plan) -> Result<Recorder, TargetError> {
    let mut pickers = (0..plan.connections as usize)
        .map(|i| picker(&plan, i))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    let mut conns = Vec::with_capacity(plan.connections as usize);
    for _ in 0..plan.connections {
        conns.push(target.connect().await?);
    }

    // A short lead so every connection starts on the same instant.
    let start = Instant::now() + Duration::from_millis(20);
    let window = Window {
        start: start + plan.warmup,
        end: start + plan.warmup + plan.duration,
    };
    let counters: Vec<Arc<Counter>> = (0..plan.connections)
        .map(|_| Arc::new(Counter::default()))
        .collect();

    let mut workers = Vec::with_capacity(conns.len());
    let mut pacer = None;
    match plan.rate {
        None => {
            for (i, conn) in conns.into_iter().enumerate() {
                let counter = Arc::clone(&counters[i]);
                workers.push(tokio::spawn(closed_loop(
                    conn,
                    pickers.next().expect("one picker per connection"),
                    plan.pipeline as usize,
                    start,
                    Recorder::new(window).sampled(plan.sample_every),
                    counter,
                )));
            }
        }
        Some(rate) => {
            let schedule = Schedule::new(start, rate, plan.batch, plan.connections);
            let total = schedule.count_before(window.end);
            let released = Arc::new(AtomicU64::new(0));
            let wakers: Vec<Arc<Notify>> = (0..plan.connections)
                .map(|_| Arc::new(Notify::new()))
                .collect();
            for (i, conn) in conns.into_iter().enumerate() {
                let open = OpenLoop {
                    schedule,
                    index: i as u32,
                    total,
                    released: Arc::clone(&released),
                    wake: Arc::clone(&wakers[i]),
                };
                let counter = Arc::clone(&counters[i]);
                workers.push(tokio::spawn(open_loop(
                    conn,
                    pickers.next().expect("one picker per connection"),
                    plan.pipeline as usize,
                    Recorder::new(window).sampled(plan.sample_every),
                    open,
                    counter,
                )));
            }
            pacer = Some(
                std::thread::Builder::new()
                    .name("tollgate-bench-pacer".to_owned())
                    .spawn(move || pace(schedule, total, window.end, &released, &wakers))
                    .expect("spawn the pacer thread"),
            );
        }
    }

    let bar = progress_bar(&plan);
    bar.set_prefix(target.name());
    let total = plan.warmup + plan.duration;
    let mut last = (Instant::now(), 0u64);
    while !workers.iter().all(|w| w.is_finished()) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = Instant::now();
        let done: u64 = counters.iter().map(|c| c.get()).sum();
        let per_sec = (done - last.1) as f64 / (now - last.0).as_secs_f64();
        last = (now, done);
        let elapsed = now.saturating_duration_since(start).min(total);
        bar.set_position(elapsed.as_millis() as u64);
        let phase = if now < window.start {
            "warm-up"
        } else if now < window.end {
            "measuring"
        } else {
            "draining"
        };
        bar.set_message(format!("{phase}: {per_sec:>10.0} checks/s"));
    }
    bar.finish_and_clear();

    let mut merged = Recorder::new(window).sampled(plan.sample_every);
    for worker in workers {
        merged.merge(worker.await.expect("a worker task panicked"));
    }
    if let Some(pacer) = pacer {
        pacer.join().expect("the pacer thread panicked");
    }
    Ok(merged)
}

fn picker(plan: &Plan, connection: usize) -> Result<KeyPicker, TargetError> {
    // Each connection draws its own sequence; the same seed gives the same
    // sequences to every target.
    KeyPicker::new(
        plan.distribution,
        plan.keys,
        plan.seed.wrapping_add(connection as u64),
    )
    .map_err(|reason| TargetError::Setup {
        target: "workload",
        addr: String::new(),
        reason,
    })
}

fn progress_bar(plan: &Plan) -> ProgressBar {
    if !plan.progress {
        return ProgressBar::hidden();
    }
    let total = (plan.warmup + plan.duration).as_millis() as u64;
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {elapsed:>3} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Closed loop: `pipeline` requests in flight, each answer sends the next,
/// until the window ends; then drains what is in flight.
async fn closed_loop<C: Connection>(
    conn: C,
    mut picker: KeyPicker,
    pipeline: usize,
    start: Instant,
    mut recorder: Recorder,
    counter: Arc<Counter>,
) -> Recorder {
    let window = recorder.window();
    tokio::time::sleep_until(start.into()).await;
    let conn = &conn;
    let mut in_flight = Pipeline::new(pipeline);
    // One clock read per answer, not three: the instant an answer is taken
    // ends its request, tells whether the window is still open, and is the
    // send time of the requests that replace it (they are built and queued
    // right after, a fraction of a microsecond later; the first poll sends
    // them). Clock reads were 5-7% of the generator's CPU at batch 1.
    let mut now = Instant::now();
    // Answers not yet added to the progress counter: added a few dozen at
    // a time, not with an atomic operation per answer.
    let mut uncounted = 0;
    loop {
        if now < window.end {
            while in_flight.len() < pipeline {
                let request = conn.build(&mut picker);
                in_flight.push(async move { (now, conn.send(request).await) });
            }
        }
        let Some((sent, answer)) = in_flight.next().await else {
            break;
        };
        now = Instant::now();
        uncounted += answer.allowed + answer.denied;
        if uncounted >= 64 {
            counter.add(std::mem::take(&mut uncounted));
        }
        recorder.record(sent, now, &answer);
    }
    counter.add(uncounted);
    recorder
}

/// One connection's view of the open-loop schedule.
struct OpenLoop {
    schedule: Schedule,
    /// This connection's index: it sends requests `index + j * connections`.
    index: u32,
    /// Requests due before the end of the run (global count).
    total: u64,
    /// Requests the pacer has released (global count).
    released: Arc<AtomicU64>,
    /// Woken by the pacer when one of our requests is released.
    wake: Arc<Notify>,
}

/// Open loop: sends each of this connection's requests once the pacer has
/// released it and a pipeline slot is free; latency counts from the
/// request's due time.
async fn open_loop<C: Connection>(
    conn: C,
    mut picker: KeyPicker,
    pipeline: usize,
    mut recorder: Recorder,
    open: OpenLoop,
    counter: Arc<Counter>,
) -> Recorder {
    let window = recorder.window();
    let conn = &conn;
    let mut in_flight = Pipeline::new(pipeline);
    let mut next = 0u64; // our next request, j-th of this connection
    loop {
        let k = open.schedule.request_of(open.index, next);
        let sending = k < open.total && Instant::now() < window.end;
        // Acquire pairs with the pacer's Release store: `k` is due.
        if sending && in_flight.len() < pipeline && k < open.released.load(Ordering::Acquire) {
            let due = open.schedule.due(k);
            let request = conn.build(&mut picker);
            let sent = Instant::now();
            recorder.record_send_lag(due, sent);
            in_flight.push(async move { (due, sent, conn.send(request).await) });
            next += 1;
            continue;
        }
        if !sending {
            // Past the end (or out of requests): count what we never sent,
            // then drain.
            let mut left = 0;
            let mut j = next;
            while open.schedule.request_of(open.index, j) < open.total {
                left += 1;
                j += 1;
            }
            recorder.add_unsent(left);
            next = j;
            if in_flight.is_empty() {
                break;
            }
        }
        let can_send = sending && in_flight.len() < pipeline;
        tokio::select! {
            Some((due, sent, answer)) = in_flight.next(), if !in_flight.is_empty() => {
                let done = Instant::now();
                counter.add(answer.allowed + answer.denied);
                recorder.record(due, done, &answer);
                recorder.record_service(sent, done, &answer);
            }
            // A permit stored by an earlier notify_one completes at once, so
            // a release between the load above and this wait is not lost.
            () = open.wake.notified(), if can_send => {}
        }
    }
    recorder
}

/// The pacer thread: releases requests as their due time comes and wakes
/// the connection each belongs to. Ends at `end` or when all are released,
/// waking every connection one last time so none waits forever.
fn pace(
    schedule: Schedule,
    total: u64,
    end: Instant,
    released: &AtomicU64,
    wakers: &[Arc<Notify>],
) {
    let connections = wakers.len() as u64;
    let mut done = 0u64;
    loop {
        let now = Instant::now();
        let due = schedule.due_count(now).min(total);
        if due > done {
            // Release before waking, so a woken connection sees its request.
            released.store(due, Ordering::Release);
            if due - done >= connections {
                wakers.iter().for_each(|w| w.notify_one());
            } else {
                for k in done..due {
                    wakers[schedule.connection_of(k) as usize].notify_one();
                }
            }
            done = due;
        }
        if done >= total || now >= end {
            break;
        }
        // Sleep until the next request is due; at most 10 ms so the end is
        // noticed in time.
        let wait = schedule
            .due(done)
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(10));
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
    wakers.iter().for_each(|w| w.notify_one());
}
