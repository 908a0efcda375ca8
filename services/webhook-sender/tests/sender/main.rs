//! The sender against receivers on loopback and an SQLite outbox in a temporary directory.

mod answers;
mod crash;
mod dns;
mod fairness;
mod harness;
mod isolation;
mod process;
mod retention;
mod retries;
mod rotation;
mod ssrf;
