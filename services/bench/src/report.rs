//! The report as Markdown: the table the harness prints and writes as BENCHMARKS.md. Every
//! figure comes from the [`BenchReport`]; nothing here is measured or assumed.

use std::{
    fmt::{self, Display, Formatter, Write},
    time::Duration,
};

use crate::{
    BenchReport, Coverage,
    idempotency::{BackendIdempotency, CREATED, REPLAYED},
    load::{Latencies, Measurement},
    overhead::{BARE, EVERY_LAYER, GUARDS_IDLE, MINIMAL_WRITES, PLAIN_TEXT},
    statements::BackendStatements,
};

/// A missing figure.
const NONE: &str = "–";

fn ms(value: f64) -> String {
    match value.abs() {
        v if v >= 100.0 => format!("{value:.0} ms"),
        v if v >= 10.0 => format!("{value:.1} ms"),
        _ => format!("{value:.2} ms"),
    }
}

fn ms_or_none(value: Option<f64>) -> String {
    value.map_or_else(|| NONE.to_owned(), ms)
}

fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0} s")
    } else {
        format!("{secs:.1} s")
    }
}

fn rate(value: f64) -> String {
    format!("{value:.0}/s")
}

fn percent(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| NONE.to_owned(), |value| format!("{value:.2}×"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// p50, p99 and max of `latency`, as three table cells.
fn cells(latency: Option<Latencies>) -> String {
    match latency {
        Some(l) => format!("{} | {} | {}", ms(l.p50), ms(l.p99), ms(l.max)),
        None => format!("{NONE} | {NONE} | {NONE}"),
    }
}

/// Every class of answer with its count, most frequent first.
fn outcomes(measurement: &Measurement) -> String {
    let mut classes: Vec<_> = measurement.classes.iter().collect();
    classes.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
    classes
        .iter()
        .map(|(name, class)| format!("{name} × {}", class.count))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Display for BenchReport {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        self.machine_table(&mut text)?;
        self.overhead(&mut text)?;
        self.precision(&mut text)?;
        self.amplification(&mut text)?;
        self.fail_fast(&mut text)?;
        self.memory(&mut text)?;
        self.idempotency(&mut text)?;
        self.tracing(&mut text)?;
        self.statements(&mut text)?;
        self.adaptive_guards(&mut text)?;
        self.edge_overload(&mut text)?;
        f.write_str(&text)
    }
}

impl BenchReport {
    fn machine_table(&self, out: &mut String) -> fmt::Result {
        let m = &self.machine;
        writeln!(out, "# Benchmarks\n")?;
        writeln!(
            out,
            "Every comparison below was measured in one run of `{}`, side by side on one machine. \
             Each chain runs in the harness's own process, beside the load generator that drives it. \
             Latencies are counted from the moment each request was due (open loop: requests leave on \
             schedule whatever the answers do), unless a table says otherwise.\n",
            m.command
        )?;
        writeln!(out, "| Machine | |\n|---|---|")?;
        writeln!(out, "| CPU | {} |", m.cpu_model)?;
        writeln!(
            out,
            "| Cores | {} ({} available to the run) |",
            m.cores, m.available_parallelism
        )?;
        writeln!(out, "| Kernel | {} |", m.kernel)?;
        writeln!(out, "| Commit | {} |", m.commit)?;
        writeln!(out, "| Command | `{}` |", m.command)?;
        writeln!(out, "| Build | {} |", m.build)?;
        writeln!(out, "| Date | {} |", m.date)?;
        writeln!(
            out,
            "| Load average at start | {} |",
            m.load_average_at_start
        )?;
        writeln!(
            out,
            "| Load average at end | {} |",
            self.load_average_at_end
        )?;
        match &self.postgres_server {
            Some(version) => writeln!(
                out,
                "| PostgreSQL | {version}, the server of `TEST_POSTGRES_URL` or `--postgres-url` |"
            )?,
            None => writeln!(
                out,
                "| PostgreSQL | none given (`TEST_POSTGRES_URL` or `--postgres-url`): not measured |"
            )?,
        }
        writeln!(out, "| Profile | {} |", self.profile.name)?;
        writeln!(out, "| Wall time | {:.0} s |", self.wall_time_s)
    }

    fn overhead(&self, out: &mut String) -> fmt::Result {
        let o = &self.overhead;
        let p = &self.profile.overhead;
        let moderate = rate(o.moderate_per_second);
        writeln!(
            out,
            "\n## 1. Overhead: every layer against bare tonic and against minimal writes\n"
        )?;
        writeln!(
            out,
            "`CreateOrder` over the gateway's gRPC face, through four hops to a bank that answers at once \
             and has no quota (payment's own limit toward it, checked on every call, is set beyond reach). \
             Ceiling: closed loop, {} clients for {}. Max sustained: the highest open-loop rate \
             sustained for {} ({}), trying rates from the ceiling down, {} at most, each 10 % of \
             the ceiling below the last. Latency: {moderate} for {}.\n",
            p.probe_clients,
            seconds(p.probe_time),
            seconds(p.step_time),
            o.sustained_when,
            p.steps,
            seconds(p.moderate_time)
        )?;
        writeln!(
            out,
            "| Chain | Ceiling | Max sustained | p50 at {moderate} | p99 at {moderate} | max at {moderate} | Success at {moderate} |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
        for chain in &o.chains {
            let sustained = match (chain.max_sustained_per_second, chain.steps.last()) {
                // Nothing above the ceiling is tried: the chain may sustain more.
                (Some(sustained), _) if chain.steps.len() == 1 => {
                    format!("{} (the ceiling)", rate(sustained))
                }
                (Some(sustained), _) => rate(sustained),
                (None, Some(lowest)) => format!("below {}", rate(lowest.offered_per_second)),
                (None, None) => NONE.to_owned(),
            };
            writeln!(
                out,
                "| {} | {} | {sustained} | {} | {} |",
                chain.chain,
                rate(chain.ceiling_per_second),
                cells(chain.moderate.latency_ms),
                percent(chain.moderate.success_rate)
            )?;
        }
        writeln!(
            out,
            "\n| Chain | Divided by | Max sustained throughput | p50 | p99 |\n|---|---|---:|---:|---:|"
        )?;
        for r in &o.ratios {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                r.chain,
                r.baseline,
                ratio(r.max_sustained_throughput),
                ratio(r.p50),
                ratio(r.p99)
            )?;
        }
        writeln!(out, "| tracing, sampled 100 % | tracing off | see 7 | | |")?;
        self.cpu_per_order(out)?;
        writeln!(out)?;
        for chain in &o.chains {
            writeln!(out, "- **{}**: {}.", chain.chain, chain.about)?;
        }
        writeln!(
            out,
            "\nRates tried (offered → successes per second, p99 from the due time):\n"
        )?;
        for chain in &o.chains {
            let steps: Vec<String> = chain
                .steps
                .iter()
                .map(|s| {
                    let verdict = if s.sustained {
                        "sustained"
                    } else {
                        "not sustained"
                    };
                    format!(
                        "{} → {}, p99 {}, {} dropped: {verdict}",
                        rate(s.offered_per_second),
                        rate(s.successes_per_second),
                        ms_or_none(s.p99_ms),
                        s.dropped
                    )
                })
                .collect();
            writeln!(
                out,
                "- {}: {}",
                chain.chain,
                if steps.is_empty() {
                    NONE.to_owned()
                } else {
                    steps.join("; ")
                }
            )?;
        }
        for chain in &o.chains {
            if chain.moderate.successes < chain.moderate.due {
                writeln!(
                    out,
                    "\n{} at {moderate}: {}.",
                    chain.chain,
                    outcomes(&chain.moderate)
                )?;
            }
        }
        Ok(())
    }

    /// Where a create's CPU goes: each chain's CPU per request during its ceiling probe, less the
    /// chain below it, from the bare hops up to every layer.
    fn cpu_per_order(&self, out: &mut String) -> fmt::Result {
        let cpu = |label: &str| {
            self.overhead
                .chains
                .iter()
                .find(|chain| chain.chain == label)
                .and_then(|chain| chain.cpu_us_per_request)
        };
        let parts = [
            (
                "the hops themselves: gRPC, four services, the load generator's client",
                None,
                BARE,
            ),
            (
                "writing one row per request at orders and at payment",
                Some(BARE),
                MINIMAL_WRITES,
            ),
            (
                "the rest of the bookkeeping: keys, phases, recovery points, the outbox; deadline, ledger and intake layers",
                Some(MINIMAL_WRITES),
                GUARDS_IDLE,
            ),
            (
                "the guards' decisions: retries under the budget, breakers, bulkheads, quotas",
                Some(GUARDS_IDLE),
                EVERY_LAYER,
            ),
        ];
        writeln!(
            out,
            "\nCPU per order (the whole process's user and system time per success during each chain's ceiling probe, each part the difference between two chains):\n"
        )?;
        writeln!(out, "| Part | CPU per order |\n|---|---:|")?;
        for (part, below, chain) in parts {
            let value = match below {
                None => cpu(chain),
                Some(below) => cpu(chain)
                    .zip(cpu(below))
                    .map(|(chain, below)| chain - below),
            };
            writeln!(
                out,
                "| {part} | {} |",
                value.map_or_else(|| NONE.to_owned(), |us| format!("{us:.0} µs"))
            )?;
        }
        writeln!(
            out,
            "| every layer, in all | {} |",
            cpu(EVERY_LAYER).map_or_else(|| NONE.to_owned(), |us| format!("{us:.0} µs"))
        )?;
        let tls = cpu(EVERY_LAYER)
            .zip(cpu(PLAIN_TEXT))
            .map(|(tls, plain)| tls - plain);
        writeln!(
            out,
            "| of which mutual TLS between the hops (every layer less {PLAIN_TEXT}) | {} |",
            tls.map_or_else(|| NONE.to_owned(), |us| format!("{us:.0} µs"))
        )
    }

    fn precision(&self, out: &mut String) -> fmt::Result {
        let d = &self.deadline_precision;
        let p = &self.profile.precision;
        writeln!(
            out,
            "\n## 2. Deadline precision: the bank hanging, clients' deadline {}\n",
            ms(d.deadline_ms)
        )?;
        writeln!(
            out,
            "Every bank call hangs; {} requests at {} per face, each with a {} deadline (`grpc-timeout`, \
             `X-Request-Timeout-Ms`), breakers off. Answer − deadline is from the moment each request \
             was sent; negative means the answer came before the deadline (each hop keeps part of what \
             it receives for its own reply, so the bank's call ends first).\n",
            p.requests,
            rate(p.per_second),
            ms(d.deadline_ms)
        )?;
        writeln!(
            out,
            "| Face | Answered by the chain | Client gave up first | Answer − deadline: min | p50 | p99 | max | Outcomes |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|")?;
        for face in &d.faces {
            let offsets = match face.offset_ms {
                Some(o) => format!(
                    "{} | {} | {} | {}",
                    ms(o.min),
                    ms(o.p50),
                    ms(o.p99),
                    ms(o.max)
                ),
                None => format!("{NONE} | {NONE} | {NONE} | {NONE}"),
            };
            writeln!(
                out,
                "| {} | {} | {} | {offsets} | {} |",
                face.face.name(),
                face.answered_by_chain,
                face.client_gave_up,
                outcomes(&face.measurement)
            )?;
        }
        writeln!(
            out,
            "\nWork at each hop (`finished late`: completed after its deadline, work nobody reads; \
             `expired`: answered DEADLINE_EXCEEDED when the deadline passed at that hop):\n"
        )?;
        writeln!(
            out,
            "| Face | Hop | Requests | Expired | Finished late | Abandoned by the caller | Failed fast |\n|---|---|---:|---:|---:|---:|---:|"
        )?;
        for face in &d.faces {
            for hop in &face.hops {
                let s = hop.stats;
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    face.face.name(),
                    hop.hop,
                    s.requests,
                    s.expired,
                    s.finished_late,
                    s.abandoned,
                    s.failed_fast
                )?;
            }
        }
        for face in &d.faces {
            writeln!(
                out,
                "\n{}: {} bank calls hung; {} charges completed after their deadline.",
                face.face.name(),
                face.bank_hung,
                face.bank_late_completions
            )?;
        }
        Ok(())
    }

    fn amplification(&self, out: &mut String) -> fmt::Result {
        let a = &self.amplification;
        let p = &self.profile.amplification;
        writeln!(
            out,
            "\n## 3. Amplification and waste: budgeted against naive\n"
        )?;
        writeln!(
            out,
            "Each run sends requests over HTTP for {} at the rate given, on a fresh chain; the bank takes {} ± {} \
             before it fails or answers; clients give up after {}. The budgeted chain's breakers are off, so \
             this is its retry policy alone (budget and throttle). Bank calls are counted until {} after the \
             last client left.\n",
            seconds(p.duration),
            ms(a.bank_latency_ms.mean),
            ms(a.bank_latency_ms.stddev),
            ms(a.client_deadline_ms),
            seconds(p.settle)
        )?;
        writeln!(
            out,
            "| Bank failing | Requests | Chain | Bank calls per request | Success | p99 | Clients gave up | Bank calls after the clients left | Work finished after its deadline |"
        )?;
        writeln!(out, "|---:|---:|---|---:|---:|---:|---:|---:|---:|")?;
        for run in &a.runs {
            writeln!(
                out,
                "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |",
                percent(run.bank_failure_rate),
                rate(run.per_second),
                run.chain,
                run.bank_calls_per_request,
                percent(run.success_rate),
                ms_or_none(run.p99_ms),
                run.clients_gave_up,
                run.bank_calls_after_clients_left,
                run.finished_late
            )?;
        }
        Ok(())
    }

    fn fail_fast(&self, out: &mut String) -> fmt::Result {
        let p = &self.profile.fail_fast;
        writeln!(
            out,
            "\n## 4. Fail-fast: the answers of an open breaker and a full bulkhead\n"
        )?;
        writeln!(
            out,
            "{} requests at {} over gRPC per guard, gateway retries off; latency end to end at the \
             gateway, beside the calls that reached the bank. Both guards are payment's, toward the \
             bank. A call the full bulkhead refuses has passed the gateway and orders, which records \
             the order before it calls payment; once the breaker has refused one call, orders keeps \
             the wait it named and refuses the next creates itself, before writing anything.\n",
            p.requests,
            rate(p.per_second)
        )?;
        writeln!(
            out,
            "| Guard | Setup | Refused at once | p50 | p99 | max | Reached the bank | p50 | p99 | max |"
        )?;
        writeln!(out, "|---|---|---:|---:|---:|---:|---|---:|---:|---:|")?;
        for g in &self.fail_fast.guards {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} ({}) | {} |",
                g.guard,
                g.setup,
                g.rejected,
                cells(g.rejected_latency_ms),
                g.passed,
                g.passed_class,
                cells(g.passed_latency_ms)
            )?;
        }
        Ok(())
    }

    fn memory(&self, out: &mut String) -> fmt::Result {
        let m = &self.memory;
        writeln!(
            out,
            "\n## 5. Memory: the bank hanging, {} clients at once\n",
            m.clients
        )?;
        let runs = match &m.runs {
            Coverage::Measured(runs) => runs,
            Coverage::NotMeasured(not) => return writeln!(out, "**{}**", not.reason),
        };
        writeln!(
            out,
            "Peak resident memory (VmHWM) of {}. The clients arrive within {} over HTTP, each \
             allowing {}, and every bank call hangs.\n",
            m.scope,
            seconds(Duration::from_secs_f64(
                m.clients as f64 / self.profile.memory.per_second
            )),
            ms(m.deadline_ms)
        )?;
        writeln!(
            out,
            "| Chain | Resident before | Peak during the run | Peak above before | Held at the bank | Outcomes |\n|---|---:|---:|---:|---:|---|"
        )?;
        for run in runs {
            let reset = if run.peak_reset {
                ""
            } else {
                " (peak not reset: it may be an earlier one)"
            };
            writeln!(
                out,
                "| {} | {} | {}{reset} | +{} | {} | {} |",
                run.chain,
                mib(run.before.rss_kib),
                mib(run.after.peak_rss_kib),
                mib(run.peak_growth_kib),
                run.held_at_bank,
                outcomes(&run.measurement)
            )?;
        }
        writeln!(out)?;
        for run in runs {
            writeln!(out, "- **{}**: {}.", run.chain, run.about)?;
        }
        Ok(())
    }

    fn tracing(&self, out: &mut String) -> fmt::Result {
        writeln!(
            out,
            "\n## 7. Tracing: every span made and exported, against tracing off\n"
        )?;
        let t = match &self.tracing {
            Coverage::Measured(t) => t,
            Coverage::NotMeasured(not) => {
                return writeln!(out, "**Not measured**: {}.", not.reason);
            }
        };
        writeln!(
            out,
            "Over HTTP, one request in flight, a bank that answers at once, every layer on: after a \
             warm-up round that counts for neither side, {} rounds of {} creates each with span making \
             off and on (every span sampled and exported over OTLP/gRPC to a receiver in the same \
             process), which side goes first alternating. Medians of the rounds' percentiles; \
             throughput over all rounds of a side. {} spans were received, the warm-up's included.\n",
            t.rounds, t.requests_per_round, t.spans_received
        )?;
        writeln!(
            out,
            "| Tracing | p50 | p99 | Orders per second |\n|---|---:|---:|---:|"
        )?;
        writeln!(
            out,
            "| off | {} | {} | {} |",
            ms(t.untraced.p50_ms),
            ms(t.untraced.p99_ms),
            rate(t.untraced.per_second)
        )?;
        writeln!(
            out,
            "| sampled 100 % | {} | {} | {} |",
            ms(t.traced.p50_ms),
            ms(t.traced.p99_ms),
            rate(t.traced.per_second)
        )?;
        writeln!(
            out,
            "| on ÷ off | {} | | {} |",
            ratio(Some(t.p50_ratio)),
            ratio(Some(t.throughput_ratio))
        )
    }

    fn idempotency(&self, out: &mut String) -> fmt::Result {
        let p = &self.profile.idempotency;
        writeln!(
            out,
            "\n## 6. Idempotency: first execution, replay, throughput\n"
        )?;
        writeln!(
            out,
            "Over HTTP, a bank that answers at once: {} creates at {}, then the same {} again with \
             the same keys; then {} clients sending one create after the other, new keys, {} in all.\n",
            p.requests,
            rate(p.per_second),
            p.requests,
            p.throughput_clients,
            p.throughput_requests
        )?;
        writeln!(
            out,
            "| Backend | First execution p50 | p99 | max | Replay p50 | p99 | max | Replayed | Paid orders per second |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let row = |out: &mut String, b: &BackendIdempotency| {
            let backend = match &b.server_version {
                Some(version) => format!("{} {version}", b.backend),
                None => b.backend.to_owned(),
            };
            writeln!(
                out,
                "| {backend} | {} | {} | {}/{} | {} |",
                cells(b.first.latency(CREATED)),
                cells(b.replay.latency(REPLAYED)),
                b.replay.count(REPLAYED),
                b.replay.due,
                rate(b.throughput.successes_per_second)
            )
        };
        row(out, &self.idempotency.sqlite)?;
        row(out, &self.idempotency.sqlite_normal)?;
        match &self.idempotency.postgres {
            Coverage::Measured(postgres) => row(out, postgres)?,
            Coverage::NotMeasured(not) => {
                writeln!(out, "| PostgreSQL | **{}** | | | | | | | |", not.reason)?
            }
        }
        let measured = [&self.idempotency.sqlite, &self.idempotency.sqlite_normal]
            .into_iter()
            .chain(match &self.idempotency.postgres {
                Coverage::Measured(postgres) => Some(postgres),
                Coverage::NotMeasured(_) => None,
            });
        // Anything but a paid order or a replay is worth a line of its own.
        for b in measured {
            for (what, measurement) in [
                ("first executions", &b.first),
                ("replays", &b.replay),
                ("throughput", &b.throughput),
            ] {
                if measurement.successes < measurement.due {
                    writeln!(out, "\n{} {what}: {}.", b.backend, outcomes(measurement))?;
                }
            }
        }
        Ok(())
    }

    fn adaptive_guards(&self, out: &mut String) -> fmt::Result {
        let p = &self.profile.ramp;
        writeln!(
            out,
            "\n## 9. Guards that learn: the bank slowing from {} to {}\n",
            ms(p.from_ms),
            ms(p.to_ms)
        )?;
        writeln!(
            out,
            "Over gRPC, {} for {}, each create allowing {}, while the bank's mean latency climbs \
             evenly from {} to {} (spread a tenth of the mean); a fresh chain per variant, breakers \
             off in all. Goodput: creates that succeeded, per second. Past the deadline: bank calls \
             whose caller had given up before the bank answered, work nobody read.\n",
            rate(p.per_second),
            seconds(p.duration),
            ms(p.deadline.as_secs_f64() * 1e3),
            ms(p.from_ms),
            ms(p.to_ms)
        )?;
        let table = |out: &mut String,
                     title: &str,
                     runs: &[crate::adaptive::RampRun]|
         -> fmt::Result {
            writeln!(out, "{title}\n")?;
            writeln!(
                out,
                "| Variant | Setup | Goodput | Success | p50 | p99 | max | Bank calls | Past the deadline | Failed fast | Bulkhead full |"
            )?;
            writeln!(
                out,
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            )?;
            for r in runs {
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    r.variant,
                    r.setup,
                    rate(r.successes_per_second),
                    percent(r.success_rate),
                    cells(r.latency_ms),
                    r.bank_calls,
                    r.bank_calls_past_deadline,
                    r.failed_fast,
                    r.bulkhead_full
                )?;
            }
            writeln!(out)
        };
        table(
            out,
            "**Fail fast**: fixed minimums against the observed latency as well.",
            &self.adaptive_guards.fail_fast,
        )?;
        table(
            out,
            "**Concurrency toward the bank**: no limit, the fixed bulkhead, the adaptive limit.",
            &self.adaptive_guards.concurrency,
        )
    }

    fn edge_overload(&self, out: &mut String) -> fmt::Result {
        let (p, o) = (&self.profile.overload, &self.edge_overload);
        writeln!(
            out,
            "\n## 10. The edge under overload: {}× what the chain serves\n",
            p.overload
        )?;
        writeln!(
            out,
            "Over gRPC, a bank answering in {} (spread a tenth of it). The chain's capacity, {} successes \
             a second, was measured first with {} closed-loop clients for {}; each intake then got {} \
             for {}, open loop, on a fresh chain, each create allowing {}. Admitted: not refused or shed \
             by the gateway. In time: admitted and answered with success within the deadline.\n",
            ms(p.bank_latency_ms),
            rate(o.capacity_per_second),
            p.probe_clients,
            seconds(p.probe_time),
            rate(o.offered_per_second),
            seconds(p.duration),
            ms(p.deadline.as_secs_f64() * 1e3)
        )?;
        writeln!(
            out,
            "| Intake | Setup | Goodput | Admitted | In time | p50 | p99 | max | Refused or shed | Outcomes |"
        )?;
        writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|")?;
        for r in &o.runs {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.intake,
                r.setup,
                rate(r.successes_per_second),
                r.admitted,
                percent(r.admitted_in_time),
                cells(r.admitted_latency_ms),
                r.refused,
                outcomes(&r.measurement)
            )?;
        }
        Ok(())
    }

    fn statements(&self, out: &mut String) -> fmt::Result {
        let s = &self.statements;
        let p = &self.profile.statements;
        writeln!(
            out,
            "\n## 8. Queries and statements per create: what a create asks of the databases\n"
        )?;
        writeln!(
            out,
            "Over HTTP, a bank that answers at once, on a fresh chain per backend: {} creates one at a \
             time, the same {} again (replays), then {} new creates from {} clients at once. In orders' and \
             payment's databases, the trips (the times a create waits for a database) and the statements by \
             their first word, divided by the successes (the chain's background polls included). On SQLite a \
             trip is a unit of work handed to the file's writer thread and back, whatever its statements (a \
             read runs on the caller's thread: no trip); on PostgreSQL each query is a network round trip. sqlx does \
             not report PostgreSQL's `BEGIN` (it is sent as a simple query of its own): there, one more round \
             trip precedes each transaction that ends in a `COMMIT` or is rolled back.\n",
            p.requests, p.requests, p.requests, s.clients
        )?;
        let backends: Vec<&BackendStatements> = std::iter::once(&s.sqlite)
            .chain(match &s.postgres {
                Coverage::Measured(postgres) => Some(postgres),
                Coverage::NotMeasured(_) => None,
            })
            .collect();
        let mut kinds: Vec<&str> = backends
            .iter()
            .flat_map(|b| {
                b.rounds
                    .iter()
                    .flat_map(|r| r.per_request.keys().map(String::as_str))
            })
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        writeln!(
            out,
            "| Backend | Round | Successes | Trips per success | Statements per success | {} |",
            kinds.join(" | ")
        )?;
        writeln!(
            out,
            "|---|---|---:|---:|---:|{}",
            "---:|".repeat(kinds.len())
        )?;
        for b in &backends {
            for r in &b.rounds {
                let by_kind: Vec<String> = kinds
                    .iter()
                    .map(|kind| {
                        r.per_request
                            .get(*kind)
                            .map_or("".into(), |n| format!("{n:.2}"))
                    })
                    .collect();
                writeln!(
                    out,
                    "| {} | {} | {} | {:.2} | {:.2} | {} |",
                    b.backend,
                    r.label,
                    r.successes,
                    r.trips_per_request,
                    r.total_per_request,
                    by_kind.join(" | ")
                )?;
            }
        }
        if let Coverage::NotMeasured(not) = &s.postgres {
            writeln!(out, "\nPostgreSQL: **{}**.", not.reason)?;
        }
        Ok(())
    }
}
