//! The OpenAPI 3.1 document of the HTTP/JSON face, served at `GET /openapi.json` and committed as
//! `openapi.json` beside this crate's manifest.
//!
//! Each handler describes its own operation in a `#[utoipa::path]` next to it, from the types it
//! reads and writes; [`document`] adds what every route shares because a layer or the one error
//! mapping answers it, not the handler: the statuses of the rate limit, the intake, the deadline
//! and the request-head limits, the failures relayed from orders, and the headers that every
//! answer carries.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::{
    Modify, OpenApi, ToSchema,
    openapi::{
        self, Content, HeaderBuilder, ObjectBuilder, Ref, RefOr, Required, ResponseBuilder, Type,
        path::{Operation, ParameterBuilder, ParameterIn},
        security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    },
};

use crate::error::Problem;

/// The media type of every error answer (RFC 9457).
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// The name of the bearer scheme that every operation but the document itself requires (in the
/// `security` of [`Base`] too).
const BEARER: &str = "api_key";

#[derive(OpenApi)]
#[openapi(
    info(title = "Gateway HTTP API"),
    tags(
        (name = "orders", description = "Orders: created and paid under one deadline, read with fallbacks."),
        (name = "webhooks", description = "The client's webhook endpoints and their deliveries."),
        (name = "document", description = "This description of the API."),
    ),
    components(schemas(Problem)),
    security(("api_key" = [])),
    modifiers(&BearerScheme),
)]
struct Base;

/// `Authorization: Bearer <api key>`, one of the gateway's `clients` keys.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, document: &mut openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("An API key of the gateway's `clients` setting (demo keys: `demo-key-1`, `demo-key-2`)."))
            .build();
        document
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

/// The document as served, made once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    document()
        .to_pretty_json()
        .expect("the document serializes")
        + "\n"
});

/// The document: the routes' operations on top of [`Base`], and what every route shares.
pub(crate) fn document() -> openapi::OpenApi {
    let mut document = Base::openapi();
    document.merge(
        super::order_creation()
            .merge(super::routes())
            .into_openapi(),
    );
    let components = document.components.get_or_insert_with(Default::default);
    for (name, description, schema) in HEADERS {
        let header = HeaderBuilder::new()
            .schema(Some(ObjectBuilder::new().schema_type(schema.clone())))
            .description(Some(*description));
        components
            .headers
            .insert((*name).to_owned(), header.build().into());
    }
    let timeout = header_parameter(
        TIMEOUT,
        "The operation's deadline in milliseconds; never longer than the gateway's maximum (2000 ms by default).",
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .maximum(Some(u64::MAX)),
    );
    let traceparent = header_parameter(
        TRACEPARENT,
        "W3C trace context: the operation's spans join this trace.",
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")),
    );
    components
        .parameters
        .insert(TIMEOUT.to_owned(), timeout.into());
    components
        .parameters
        .insert(TRACEPARENT.to_owned(), traceparent.into());
    for shared in SHARED {
        let mut response = problem(shared.description);
        add_headers(&shared.status.to_string(), &mut response);
        components
            .responses
            .insert(shared.name.to_owned(), response.into());
    }
    for item in document.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            add_shared(operation);
        }
    }
    document
}

/// The document's JSON text, as `GET /openapi.json` answers it.
pub(crate) fn document_json() -> &'static str {
    DOCUMENT.as_str()
}

/// The description of the HTTP API.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "document",
    operation_id = "get_openapi_document",
    security(()),
    responses((status = 200, description = "This document (OpenAPI 3.1).", body = Object, content_type = "application/json")),
)]
pub(super) async fn serve_document() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_json(),
    )
}

/// A status that a layer, an extractor or the error mapping may answer on a route, whatever its
/// handler does.
struct Shared {
    status: u16,
    /// Its name among the document's responses.
    name: &'static str,
    description: &'static str,
    on: Routes,
}

/// The routes a [`Shared`] status applies to.
#[derive(Clone, Copy, PartialEq)]
enum Routes {
    All,
    /// Those that need an API key, which are those that call orders.
    Authenticated,
    /// Those that read a JSON body.
    WithBody,
    /// Those that take an `Idempotency-Key`.
    Keyed,
}

const SHARED: &[Shared] = &[
    Shared {
        status: 400,
        name: "InvalidRequest",
        description: "Invalid request: a header, path parameter, query parameter or body field breaks a rule (`field` names it), such as a malformed `X-Request-Timeout-Ms`.",
        on: Routes::All,
    },
    Shared {
        status: 401,
        name: "Unauthenticated",
        description: "No `Authorization: Bearer <known API key>`.",
        on: Routes::Authenticated,
    },
    Shared {
        status: 403,
        name: "Forbidden",
        description: "`PERMISSION_DENIED` from below: orders does not admit this gateway (a fault of the deployment's certificates).",
        on: Routes::Authenticated,
    },
    Shared {
        status: 409,
        name: "KeyInFlight",
        description: "A request with this idempotency key is still in flight: nothing was done, retry later.",
        on: Routes::Keyed,
    },
    Shared {
        status: 413,
        name: "BodyTooLarge",
        description: "The body is over 2 MB.",
        on: Routes::WithBody,
    },
    Shared {
        status: 414,
        name: "UriTooLong",
        description: "The path and query are over 8 KiB.",
        on: Routes::All,
    },
    Shared {
        status: 415,
        name: "NotJson",
        description: "A body not sent as `application/json`.",
        on: Routes::WithBody,
    },
    Shared {
        status: 422,
        name: "KeyReused",
        description: "The idempotency key was used with another request: nothing was done.",
        on: Routes::Keyed,
    },
    Shared {
        status: 429,
        name: "TooManyRequests",
        description: "The client is over its quota (with `Retry-After`, `RateLimit` and `RateLimit-Policy`), or `RESOURCE_EXHAUSTED` from below.",
        on: Routes::All,
    },
    Shared {
        status: 431,
        name: "HeaderFieldsTooLarge",
        description: "The headers are over 16 KiB together.",
        on: Routes::All,
    },
    Shared {
        status: 502,
        name: "DependencyFailed",
        description: "Any other failure below (`INTERNAL`, `UNKNOWN`, `UNIMPLEMENTED`, …), in `grpc_code`.",
        on: Routes::Authenticated,
    },
    Shared {
        status: 503,
        name: "Unavailable",
        description: "The gateway is full (`Overloaded`, `Retry-After: 1`), or a dependency is unavailable or its circuit is open (`Retry-After` when known).",
        on: Routes::All,
    },
    Shared {
        status: 504,
        name: "DeadlineExceeded",
        description: "The deadline passed, at the gateway or below; `X-Deadline-Ledger` shows where the budget went.",
        on: Routes::All,
    },
];

/// The response headers, by name: their description and type.
const HEADERS: &[(&str, &str, Type)] = &[
    (
        "X-Deadline-Ledger",
        "Per hop, outermost first: the budget received, spent, reserved, forwarded and left, in ms. Absent on the answers given before the deadline starts (the rate limit's `429`, the intake's `503`, a malformed `X-Request-Timeout-Ms`).",
        Type::String,
    ),
    (
        "Server-Timing",
        "The same ledger as one metric per hop (`dur` is the hop's whole time); absent where `X-Deadline-Ledger` is.",
        Type::String,
    ),
    (
        "traceparent",
        "W3C trace context of the operation's trace.",
        Type::String,
    ),
    (
        "RateLimit",
        "The client's quota left: `\"default\";r=<requests left>;t=<seconds until full>`.",
        Type::String,
    ),
    (
        "RateLimit-Policy",
        "The client's quota: `\"default\";q=<burst>;w=<seconds>`.",
        Type::String,
    ),
    (
        "Retry-After",
        "Seconds to wait before trying again, when known: a quota, a full intake, a pushback from below, an open circuit's next probe.",
        Type::Integer,
    ),
    ("WWW-Authenticate", "`Bearer`.", Type::String),
];

/// The headers every answer may carry.
const EVERY_ANSWER: &[&str] = &[
    "X-Deadline-Ledger",
    "Server-Timing",
    "traceparent",
    "RateLimit",
    "RateLimit-Policy",
];

const TIMEOUT: &str = "X-Request-Timeout-Ms";
const TRACEPARENT: &str = "traceparent";
/// The header that makes a route [`Routes::Keyed`]; each such handler names it.
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// An optional request header.
fn header_parameter(
    name: &str,
    description: &str,
    schema: ObjectBuilder,
) -> openapi::path::Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

/// Adds to `operation` the request headers every route reads, the statuses of [`SHARED`] it
/// does not describe itself, and the headers its own answers may carry.
fn add_shared(operation: &mut Operation) {
    // An operation with no security of its own requires the document's bearer scheme.
    let authenticated = operation.security.is_none();
    let with_body = operation.request_body.is_some();
    let parameters = operation.parameters.get_or_insert_with(Vec::new);
    let keyed = parameters.iter().any(
        |parameter| matches!(parameter, RefOr::T(parameter) if parameter.name == IDEMPOTENCY_KEY),
    );
    for name in [TIMEOUT, TRACEPARENT] {
        parameters.push(RefOr::Ref(Ref::new(format!(
            "#/components/parameters/{name}"
        ))));
    }
    let responses = &mut operation.responses.responses;
    for (status, response) in responses.iter_mut() {
        if let RefOr::T(response) = response {
            add_headers(status, response);
        }
    }
    let applies = |routes| match routes {
        Routes::All => true,
        Routes::Authenticated => authenticated,
        Routes::WithBody => with_body,
        Routes::Keyed => keyed,
    };
    for shared in SHARED.iter().filter(|shared| applies(shared.on)) {
        responses
            .entry(shared.status.to_string())
            .or_insert_with(|| Ref::from_response_name(shared.name).into());
    }
}

/// The headers that an answer with `status` may carry, as references to the document's.
fn add_headers(status: &str, response: &mut openapi::Response) {
    let by_status: &[&str] = match status {
        "401" => &["WWW-Authenticate"],
        "429" | "503" | "504" => &["Retry-After"],
        _ => &[],
    };
    for name in EVERY_ANSWER.iter().chain(by_status) {
        response.headers.insert(
            (*name).to_owned(),
            RefOr::Ref(Ref::new(format!("#/components/headers/{name}"))),
        );
    }
}

/// An error answer: a problem (RFC 9457).
fn problem(description: &str) -> openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            PROBLEM_JSON,
            Content::new(Some(Ref::from_schema_name(Problem::name()))),
        )
        .build()
}
#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Set to write the document to the committed file instead of comparing.
    const UPDATE: &str = "UPDATE_OPENAPI";

    #[test]
    fn the_committed_document_is_the_served_one() {
        let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
        if std::env::var_os(UPDATE).is_some() {
            std::fs::write(&committed, document_json()).expect("the committed document is written");
        }
        let text = std::fs::read_to_string(&committed).unwrap_or_default();
        assert!(
            text == document_json(),
            "{} differs from the document served at GET /openapi.json; regenerate it with `{UPDATE}=1 cargo test -p gateway openapi` and commit it",
            committed.display()
        );
    }

    #[test]
    fn every_route_needs_an_api_key_but_the_document() {
        let document = document();
        for (path, item) in &document.paths.paths {
            for operation in [&item.get, &item.post, &item.delete].into_iter().flatten() {
                let public = operation.security.is_some();
                assert_eq!(public, path == "/openapi.json", "{path}");
                assert_eq!(
                    operation.responses.responses.contains_key("401"),
                    !public,
                    "{path}"
                );
            }
        }
    }
}
