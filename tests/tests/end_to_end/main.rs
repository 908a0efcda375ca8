//! The end-to-end suite: the whole chain started in-process on free ports, one module per
//! technique, in one test binary (linked once).
//!
//! Run it with cargo-nextest (the workspace's test command): every test runs in a process of its
//! own, with the timeout of `.config/nextest.toml`, and its output, the chain's logs included
//! (`RUST_LOG` sets their level), is printed when it fails. A process of its own matters here:
//! logging, metrics and the trace exporter are installed once per process, and the telemetry,
//! metrics and tracing-switch tests each install their own.

mod adaptive_guards;
mod bad_input;
mod chain;
mod collector_unreachable;
mod compose;
mod connection_flood;
mod create_outcomes;
mod deadlines;
mod fallbacks;
mod guards;
mod hardening;
mod idempotency_keys;
mod kubernetes;
mod live_view;
mod metrics;
mod mutual_tls;
mod openapi;
mod otlp_transports;
mod probes;
mod python_grpc;
mod rate_limit;
mod readme_links;
mod retries;
mod settings_tables;
mod traces;
mod tracing_switch;
mod webhook_api;
mod webhook_delivery;
