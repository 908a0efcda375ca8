use std::path::PathBuf;

use bench::{Options, Profile, chains::ChainStorage};
use clap::Parser;

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measures the chain side by side in one run: layer overhead against bare tonic, deadline
/// precision, retry amplification, fail-fast guards, memory and idempotency. Prints the table and
/// writes it as BENCHMARKS.md and BENCHMARKS.json.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Every comparison with tiny counts, in seconds (for CI; the numbers mean little).
    #[arg(long)]
    smoke: bool,
    /// A PostgreSQL database whose user may create databases, for the idempotency comparison.
    #[arg(
        long,
        value_name = "URL",
        env = "TEST_POSTGRES_URL",
        hide_env_values = true
    )]
    postgres_url: Option<String>,
    /// Where BENCHMARKS.md and BENCHMARKS.json are written (default: the repository's root;
    /// with --smoke, target/bench-smoke in it, so that the committed table stays as it is).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Counts the statements of creates on one backend and prints them as JSON: the child
    /// process of comparison 8, started by the harness itself.
    #[arg(long, value_name = "BACKEND", hide = true)]
    count_statements: Option<CountOn>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CountOn {
    Sqlite,
    Postgres,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let profile = if cli.smoke {
        Profile::smoke()
    } else {
        Profile::full()
    };
    if let Some(on) = cli.count_statements {
        let backend = match (on, cli.postgres_url) {
            (CountOn::Sqlite, _) => ChainStorage::Sqlite,
            (CountOn::Postgres, Some(url)) => ChainStorage::Postgres(url),
            (CountOn::Postgres, None) => {
                return Err("--count-statements postgres needs --postgres-url".into());
            }
        };
        let counted = bench::statements::count_in_this_process(&profile, &backend).await?;
        println!("{}", serde_json::to_string(&counted)?);
        return Ok(());
    }
    let command = format!(
        "cargo run{} -p bench{}",
        if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        },
        if cli.smoke { " -- --smoke" } else { "" }
    );
    let options = Options {
        profile,
        postgres_url: cli.postgres_url,
        command,
        bench_executable: std::env::current_exe()?,
    };
    let report = bench::run(&options).await?;
    println!("{report}");
    let out_dir = cli.out_dir.unwrap_or_else(|| {
        let root = bench::repository_root();
        if cli.smoke {
            root.join("target").join("bench-smoke")
        } else {
            root
        }
    });
    let written = bench::write(&report, &out_dir)?;
    eprintln!(
        "written: {} and {}",
        written.markdown.display(),
        written.json.display()
    );
    Ok(())
}
