use std::sync::Arc;

use super::error::Refusal;

/// Methods that every caller with a certificate of the chain may call: a service's own
/// `healthcheck` subcommand presents the service's certificate.
const HEALTH: &str = "/grpc.health.v1.Health/*";

/// What the operator's certificate may use on every inner service besides health: describing
/// it. No business method: metrics and probes are on the operations port ([`crate::ops`]), which
/// needs no certificate, so the operator's needs none of the clients' data.
const OPERATOR_TOOLS: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/*",
    "/grpc.reflection.v1alpha.ServerReflection/*",
];

/// Which callers a server answers, and what each may call.
///
/// Methods are request paths: `/orders.v1.Orders/GetOrder`, or `/orders.v1.Orders/*` for every
/// method of a service. Anything not allowed is refused.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: Arc<Vec<Rule>>,
}

#[derive(Debug, Clone)]
struct Rule {
    caller: String,
    methods: Vec<String>,
    speaks_for_clients: bool,
}

/// What an admitted call may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Whether the caller's `x-client-id` is believed; otherwise it is removed.
    pub speaks_for_clients: bool,
}

impl Policy {
    pub fn new() -> Self {
        Self::default()
    }

    /// `caller` (a service name from its certificate) may call `methods`.
    pub fn allow(self, caller: &str, methods: &[&str]) -> Self {
        self.rule(caller, methods, false)
    }

    /// `caller` may call `methods` on behalf of the client it names in `x-client-id` (the
    /// gateway, which authenticated that client's API key).
    pub fn allow_for_clients(self, caller: &str, methods: &[&str]) -> Self {
        self.rule(caller, methods, true)
    }

    /// The operator's certificate may call health and reflection.
    pub fn allow_operator(self) -> Self {
        self.rule(crate::dev_certs::OPERATOR, &OPERATOR_TOOLS, false)
    }

    fn rule(mut self, caller: &str, methods: &[&str], speaks_for_clients: bool) -> Self {
        let rule = Rule {
            caller: caller.to_owned(),
            methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            speaks_for_clients,
        };
        Arc::make_mut(&mut self.rules).push(rule);
        self
    }

    /// Decides one request from the caller's identity (`None`: no certificate) and its path.
    pub fn decide(&self, caller: Option<&str>, path: &str) -> Result<Admitted, Refusal> {
        let caller = caller.ok_or(Refusal::NoCertificate)?;
        let allowed =
            |rule: &Rule| rule.caller == caller && rule.methods.iter().any(|m| matches(m, path));
        if let Some(rule) = self.rules.iter().find(|rule| allowed(rule)) {
            return Ok(Admitted {
                speaks_for_clients: rule.speaks_for_clients,
            });
        }
        if matches(HEALTH, path) {
            return Ok(Admitted {
                speaks_for_clients: false,
            });
        }
        Err(Refusal::NotAllowed {
            caller: caller.to_owned(),
            path: path.to_owned(),
        })
    }
}

fn matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix) && !path[prefix.len()..].contains('/'),
        None => pattern == path,
    }
}
