//! What the workspace's test suites share:
//! - [`eventually`]: every wait on a condition, with a limit, so that a regression fails instead
//!   of hanging;
//! - [`missing`]: the rule for a dependency that is not there (PostgreSQL, Docker with Compose):
//!   in CI the test fails; elsewhere it says so on the terminal, past the runner's capture;
//! - [`postgres_admin_url`] and [`ScratchDatabase`]: a database of its own per test, dropped when
//!   the test ends;
//! - [`quiet_http2`]: an HTTP/2 client that answers pings but never asks anything;
//! - [`test_ca`]: a CA that signs renewed certificates.

use std::{future::Future, io::Write, time::Duration};

use sqlx::{Connection, Executor, PgConnection};

pub mod quiet_http2;
pub mod test_ca;

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// What a condition of [`eventually`] answers: `bool`, or `Option<T>` to hand back what it found.
pub trait ConditionAnswer {
    type Value;
    fn settled(self) -> Option<Self::Value>;
}

impl ConditionAnswer for bool {
    type Value = ();
    fn settled(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> ConditionAnswer for Option<T> {
    type Value = T;
    fn settled(self) -> Option<T> {
        self
    }
}

/// Checks `condition` until it holds and returns what it found; panics naming `what` once `limit`
/// has passed. It runs on tokio's clock, so it also serves tests with a paused clock.
pub async fn eventually<F, Fut>(
    limit: Duration,
    what: &str,
    mut condition: F,
) -> <Fut::Output as ConditionAnswer>::Value
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: ConditionAnswer,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = condition().await.settled() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {limit:?}: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Whether this run is CI's (`CI` set to anything but `false` or empty), where nothing may skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "false")
}

/// A dependency of a test is missing. In CI that fails the test; elsewhere the skip is written to
/// the terminal (stderr when there is none), so that it shows even when the test passes.
pub fn missing(dependency: &str, consequence: &str) {
    assert!(
        !in_ci(),
        "{dependency} is required in CI (CI is set): {consequence}"
    );
    let line = format!("SKIPPED: {dependency}: {consequence}\n");
    let terminal = std::fs::OpenOptions::new().write(true).open("/dev/tty");
    let written = terminal.and_then(|mut terminal| terminal.write_all(line.as_bytes()));
    if written.is_err() {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// The URL of a PostgreSQL database whose user may create databases, from `TEST_POSTGRES_URL`;
/// `None`, after saying so by [`missing`], when it is not set.
pub fn postgres_admin_url() -> Option<String> {
    let url = std::env::var("TEST_POSTGRES_URL")
        .ok()
        .filter(|url| !url.is_empty());
    if url.is_none() {
        missing(
            "PostgreSQL (TEST_POSTGRES_URL is not set)",
            "the PostgreSQL half of this test did not run",
        );
    }
    url
}

/// A database of its own on the server of an admin URL, so that tests running at once never see
/// each other's rows; dropped, with any connection still open to it, when this is dropped.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Creates `<prefix>_<unique>` on the server of `admin_url`.
    pub async fn create(admin_url: &str, prefix: &str) -> Self {
        let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
        let mut admin = PgConnection::connect(admin_url)
            .await
            .expect("TEST_POSTGRES_URL is reachable");
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create a scratch database");
        let base = admin_url
            .rsplit_once('/')
            .expect("an admin URL ending with a database")
            .0;
        Self {
            admin_url: admin_url.to_owned(),
            url: format!("{base}/{name}"),
            name,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        // Drop runs inside or outside a runtime, and may not block the one it is in: the database
        // is dropped on a thread of its own.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await?;
                admin
                    .execute(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .map(drop)
            })
        })
        .join();
        if let Ok(Err(error)) = dropped {
            let _ = writeln!(
                std::io::stderr(),
                "scratch database {} was not dropped: {error}",
                self.name
            );
        }
    }
}

/// One row of a README's settings table: the dotted key, its environment variable and the
/// documented default, when the default is a value (the first `code` span of its cell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentedSetting {
    pub key: String,
    pub environment: String,
    pub default: Option<String>,
}

/// The rows of every settings table in `readme`: the tables whose header starts with
/// `| Key | Environment` (or `| Setting | Environment`).
pub fn documented_settings(readme: &str) -> Vec<DocumentedSetting> {
    let code = |cell: &str| cell.split('`').nth(1).map(str::to_owned);
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.starts_with("| Key | Environment") || line.starts_with("| Setting | Environment") {
            in_table = true;
        } else if !line.starts_with('|') {
            in_table = false;
        } else if in_table
            && cells.len() > 4
            && let (Some(key), Some(environment)) = (code(cells[1]), code(cells[2]))
        {
            rows.push(DocumentedSetting {
                key,
                environment,
                default: code(cells[3]),
            });
        }
    }
    rows
}

/// Why `key` (dotted), set to `value` when given, is not a setting `T` reads with `env_prefix`:
/// `None` when it is one. A key not given a value only has to exist.
pub fn unread_setting<T>(env_prefix: &str, key: &str, value: Option<&str>) -> Option<String>
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    let defaults = serde_json::to_value(T::default()).expect("settings serialize");
    if key
        .split('.')
        .try_fold(&defaults, |tree, part| tree.get(part))
        .is_none()
    {
        return Some(format!("{key}: not a setting"));
    }
    let value = value?;
    let args = settings::SettingsArgs {
        config: None,
        overrides: vec![format!("{key}={value}")],
    };
    settings::load::<T>(env_prefix, &args)
        .err()
        .map(|error| format!("{key} = {value}: {error}"))
}

/// The dotted key an environment variable names: `PREFIX_A__B_C` → `a.b_c`.
pub fn setting_key(env_prefix: &str, environment: &str) -> Option<String> {
    let key = environment.strip_prefix(env_prefix)?.strip_prefix('_')?;
    Some(key.to_lowercase().replace("__", "."))
}

/// Checks every setting `readme` documents against the settings type `T` read with
/// `env_prefix`: its environment variable is the key's (`a.b_c` → `PREFIX_A__B_C`), the key is
/// one `T` has, and set to its documented default (when the default is a value) it loads. Rows
/// that describe a family of keys (`payment.*`, `clients[].quota`) are left to their own rows.
/// Panics listing every row that is wrong.
pub fn assert_documented_settings_are_read<T>(readme: &str, env_prefix: &str)
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    let rows = documented_settings(readme);
    assert!(!rows.is_empty(), "no settings table found");
    let mut wrong = Vec::new();
    for row in rows
        .iter()
        .filter(|row| !row.key.contains('*') && !row.key.contains("[]"))
    {
        if setting_key(env_prefix, &row.environment).as_deref() != Some(row.key.as_str()) {
            wrong.push(format!("{}: documented as {}", row.key, row.environment));
        }
        wrong.extend(unread_setting::<T>(
            env_prefix,
            &row.key,
            row.default.as_deref(),
        ));
    }
    assert!(
        wrong.is_empty(),
        "{} of {} documented settings are wrong:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}
