//! One writer per SQLite file and process: every component that opens the same file shares its
//! writer (a test binary of its own, so that no other test's writer is counted).

use std::time::Duration;

use storage::{Database, SqliteSettings, Tx};

/// The threads of this process named as SQLite's writers.
fn writers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "sqlite-writer")
        .count()
}

#[tokio::test]
async fn components_opening_one_file_share_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let orders = Database::open(&url, SqliteSettings::default(), |_| Vec::new())
        .await
        .unwrap();
    // The same file by another spelling of its path.
    let relative = format!("sqlite://{}/./shared.db", dir.path().display());
    let sender = Database::open(&relative, SqliteSettings::default(), |_| Vec::new())
        .await
        .unwrap();
    assert_eq!(writers(), 1, "two openers of one file, one writer");

    orders
        .write(async |tx: &mut Tx<'_>| tx.execute("CREATE TABLE notes (id TEXT)", &[]).await)
        .await
        .unwrap();
    sender
        .write(async |tx: &mut Tx<'_>| tx.execute("INSERT INTO notes (id) VALUES ('n')", &[]).await)
        .await
        .unwrap();
    let seen: i64 = orders
        .fetch_one("SELECT COUNT(*) FROM notes", &[])
        .await
        .unwrap();
    assert_eq!(seen, 1);

    let other = Database::open(
        &format!("sqlite://{}", dir.path().join("other.db").display()),
        SqliteSettings::default(),
        |_| Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(writers(), 2, "a second file, a second writer");

    drop((orders, sender, other));
    test_support::eventually(
        Duration::from_secs(5),
        "the writers end with their last handles",
        || async { writers() == 0 },
    )
    .await;
}
