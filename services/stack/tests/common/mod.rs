//! What the tests that run the `stack` binary share.

/// The `--set` values that put every listener of `stack up` on a free loopback port, so that the
/// binary runs beside anything else (another test, a stack a developer left running).
pub(crate) fn every_listener_on_a_free_port() -> Vec<String> {
    stack::chain::LISTENERS
        .iter()
        .map(|listener| format!("{}=127.0.0.1:0", listener.key))
        .collect()
}
