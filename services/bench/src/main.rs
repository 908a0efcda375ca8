use std::path::PathBuf;

use bench::{Options, Profile};
use clap::Parser;

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
    #[arg(long, value_name = "URL", env = "TEST_POSTGRES_URL", hide_env_values = true)]
    postgres_url: Option<String>,
    /// Where BENCHMARKS.md and BENCHMARKS.json are written (default: the repository's root;
    /// with --smoke, target/bench-smoke in it, so that the committed table stays as it is).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let command = format!(
        "cargo run{} -p bench{}",
        if cfg!(debug_assertions) { "" } else { " --release" },
        if cli.smoke { " -- --smoke" } else { "" }
    );
    let options = Options {
        profile: if cli.smoke { Profile::smoke() } else { Profile::full() },
        postgres_url: cli.postgres_url,
        command,
    };
    let report = bench::run(&options).await?;
    println!("{report}");
    let out_dir = cli.out_dir.unwrap_or_else(|| {
        let root = bench::repository_root();
        if cli.smoke { root.join("target").join("bench-smoke") } else { root }
    });
    let written = bench::write(&report, &out_dir)?;
    eprintln!("written: {} and {}", written.markdown.display(), written.json.display());
    Ok(())
}
