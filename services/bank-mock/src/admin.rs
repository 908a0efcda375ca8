//! The admin HTTP API: switch faults, read stats, reset. Every admin route needs `X-Admin-Token`;
//! `/metrics` beside them needs none.

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
};
use deadline::{HopStats, HopStatsSnapshot};
use serde::Serialize;

use crate::{
    bank::{BankState, BankStats},
    error::AdminError,
    faults::{Faults, PatchError},
};

#[derive(Clone)]
struct Admin {
    bank: Arc<BankState>,
    hop: Arc<HopStats>,
    token: Arc<str>,
}

/// `GET /admin/stats`: the bank's counters plus the deadline counters of its hop.
#[derive(Debug, Serialize)]
struct Stats {
    #[serde(flatten)]
    bank: BankStats,
    deadline: HopStatsSnapshot,
}

pub(crate) fn router(bank: Arc<BankState>, hop: Arc<HopStats>, token: Arc<str>) -> Router {
    let admin = Admin { bank, hop, token };
    Router::new()
        .route("/admin/faults", get(get_faults).put(put_faults))
        .route("/admin/stats", get(stats))
        .route("/admin/reset", post(reset))
        .route_layer(middleware::from_fn_with_state(admin.clone(), require_token))
        .with_state(admin)
}

async fn require_token(
    State(admin): State<Admin>,
    request: Request,
    next: Next,
) -> Result<Response, AdminError> {
    let presented = request
        .headers()
        .get(wire::ADMIN_TOKEN)
        .map(|value| value.as_bytes());
    if presented.is_some_and(|token| constant_time_eq(token, admin.token.as_bytes())) {
        Ok(next.run(request).await)
    } else {
        Err(AdminError::Unauthorized)
    }
}

/// Compares without an early exit, so response time does not reveal how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

async fn get_faults(State(admin): State<Admin>) -> Json<Faults> {
    Json(admin.bank.faults())
}

async fn put_faults(
    State(admin): State<Admin>,
    body: axum::body::Bytes,
) -> Result<Json<Faults>, AdminError> {
    let faults = admin.bank.update_faults(|faults| {
        *faults = faults.patched(&body)?;
        Ok::<_, PatchError>(faults.clone())
    })?;
    tracing::info!(?faults, "faults changed");
    Ok(Json(faults))
}

async fn stats(State(admin): State<Admin>) -> Json<Stats> {
    Json(Stats {
        bank: admin.bank.stats(),
        deadline: admin.hop.snapshot(),
    })
}

async fn reset(State(admin): State<Admin>) -> StatusCode {
    admin.bank.reset();
    StatusCode::NO_CONTENT
}
