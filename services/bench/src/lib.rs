#![doc = include_str!("../README.md")]

pub mod adaptive;
pub mod admission;
pub mod amplification;
pub mod bare;
pub mod chains;
pub mod clients;
pub mod fail_fast;
pub mod idempotency;
pub mod load;
pub mod machine;
pub mod memory;
pub mod overhead;
pub mod precision;
pub mod profile;
mod report;
pub mod statements;
pub mod tracing_cost;

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use serde::Serialize;

pub use profile::Profile;

/// The benchmark process in telemetry, hosting the chains it measures.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: "bench",
    version: env!("CARGO_PKG_VERSION"),
};

/// Why a run could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("a chain did not start or stop: {0}")]
    Chain(#[from] rpc::ServerError),
    #[error("a bare tonic server failed: {0}")]
    Bare(#[from] tonic::transport::Error),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] sqlx::Error),
    #[error("the minimal-writes chain's database: {0}")]
    Floor(String),
    #[error("{0}")]
    Io(std::io::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the report does not serialize: {0}")]
    Json(#[from] serde_json::Error),
    #[error("telemetry: {0}")]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error("a child process of the harness failed: {0}")]
    Child(String),
    #[error("/proc/self/status could not be read during the memory run")]
    MemoryUnreadable,
}

/// A comparison that this run could not make, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotMeasured {
    pub reason: String,
}

/// A comparison that may not have been made: its numbers, or the reason there are none.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coverage<T> {
    Measured(T),
    NotMeasured(NotMeasured),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub profile: Profile,
    /// A PostgreSQL database whose user may create databases; without one, PostgreSQL is not
    /// measured (and the report says so).
    pub postgres_url: Option<String>,
    /// How the run was started, for the report.
    pub command: String,
    /// The harness's executable, which comparison 8 starts as a child (see [`statements`]).
    pub bench_executable: PathBuf,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub machine: machine::Machine,
    /// The PostgreSQL server's version, when one was given.
    pub postgres_server: Option<String>,
    pub profile: Profile,
    /// From the start of the first comparison to the end of the last.
    pub wall_time_s: f64,
    /// /proc/loadavg when the run ended: other work on the machine meanwhile.
    pub load_average_at_end: String,
    pub overhead: overhead::Overhead,
    pub deadline_precision: precision::DeadlinePrecision,
    pub amplification: amplification::Amplification,
    pub fail_fast: fail_fast::FailFast,
    pub memory: memory::MemoryUnderHang,
    pub idempotency: idempotency::Idempotency,
    pub tracing: Coverage<tracing_cost::TracingCost>,
    pub statements: statements::Statements,
    pub adaptive_guards: adaptive::AdaptiveGuards,
    pub edge_overload: admission::EdgeOverload,
}

/// The repository this crate was built from: where BENCHMARKS.md belongs.
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("."))
}

/// Makes every comparison of `options.profile`, one after the other.
pub async fn run(options: &Options) -> Result<BenchReport, BenchError> {
    // A PostgreSQL that was named but cannot be reached is an error now, not a gap found later.
    let postgres = match &options.postgres_url {
        Some(url) => Some(idempotency::Postgres {
            url: url.clone(),
            version: chains::postgres_version(url).await?,
        }),
        None => {
            eprintln!(
                "WARNING: no PostgreSQL (TEST_POSTGRES_URL or --postgres-url): its idempotency numbers will not be measured"
            );
            None
        }
    };
    let machine = machine::Machine::describe(&repository_root(), options.command.clone());
    let profile = &options.profile;
    let started = Instant::now();
    // Memory first: its chains start in a process whose peak no earlier comparison has raised.
    eprintln!("5. Memory under a hanging bank");
    let memory = memory::measure(profile).await?;
    eprintln!("1. Overhead");
    let overhead = overhead::measure(profile).await?;
    eprintln!("2. Deadline precision");
    let deadline_precision = precision::measure(profile).await?;
    eprintln!("3. Amplification and waste");
    let amplification = amplification::measure(profile).await?;
    eprintln!("4. Fail-fast");
    let fail_fast = fail_fast::measure(profile).await?;
    eprintln!("9. Guards that learn");
    let adaptive_guards = adaptive::measure(profile).await?;
    eprintln!("10. The edge under overload");
    let edge_overload = admission::measure(profile).await?;
    eprintln!("6. Idempotency");
    let idempotency = idempotency::measure(profile, postgres.as_ref()).await?;
    eprintln!("8. Queries and statements per create");
    let statements =
        statements::measure(profile, postgres.as_ref(), &options.bench_executable).await?;
    // Last: it installs telemetry for the rest of the process.
    eprintln!("7. Tracing cost");
    let tracing = tracing_cost::measure(profile).await?;
    Ok(BenchReport {
        machine,
        postgres_server: postgres.as_ref().map(|postgres| postgres.version.clone()),
        profile: profile.clone(),
        wall_time_s: started.elapsed().as_secs_f64(),
        load_average_at_end: machine::load_average(),
        overhead,
        deadline_precision,
        amplification,
        fail_fast,
        memory,
        idempotency,
        tracing,
        statements,
        adaptive_guards,
        edge_overload,
    })
}

/// The files [`write()`] made.
#[derive(Debug, Clone)]
pub struct Written {
    pub markdown: PathBuf,
    pub json: PathBuf,
}

/// Writes `report` into `dir` (made if missing) as `BENCHMARKS.md` and `BENCHMARKS.json`.
pub fn write(report: &BenchReport, dir: &Path) -> Result<Written, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let written = Written {
        markdown: dir.join("BENCHMARKS.md"),
        json: dir.join("BENCHMARKS.json"),
    };
    let save = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|source| BenchError::Write {
            path: path.to_owned(),
            source,
        })
    };
    save(&written.markdown, report.to_string())?;
    save(&written.json, serde_json::to_string_pretty(report)? + "\n")?;
    Ok(written)
}
