//! [`ApiError`], and the one place where errors become HTTP statuses.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use herd_core::api::{Status, StatusReason};
use herd_core::kinds::NodeSpec;
use herd_core::roles::RoleRefusal;
use herd_core::{Resource, ValidationErrors};
use herd_store::StoreError;

use crate::eviction::EvictionError;
use crate::node_roles::RoleChangeError;
use crate::objects::ObjectsError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    /// Something not found, said in words already (an agent's answer).
    #[error("{0}")]
    Missing(String),
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: String, name: String },
    #[error("{0}")]
    Conflict(String),
    #[error("{kind} {name:?} is invalid: {errors}")]
    Invalid { kind: String, name: String, errors: ValidationErrors },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    Unavailable(String),
    /// A leader-only write from a replica whose leadership has ended.
    #[error("{0}")]
    Fenced(String),
    /// A method the route does not serve (405).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// A body over the server's limit (413).
    #[error("{0}")]
    PayloadTooLarge(String),
    /// Refused for now, worth asking again later: an eviction a budget
    /// does not allow (429).
    #[error("{0}")]
    TooManyRequests(String),
}

impl ApiError {
    pub fn invalid(kind: &str, name: &str, errors: ValidationErrors) -> Self {
        ApiError::Invalid { kind: kind.into(), name: name.into(), errors }
    }

    pub fn not_found(kind: &str, name: &str) -> Self {
        ApiError::NotFound { kind: kind.into(), name: name.into() }
    }

    /// Maps a store error met while working on object `name` of `kind`.
    pub fn from_store(kind: &str, name: &str, error: StoreError) -> Self {
        match error {
            StoreError::AlreadyExists(_) => ApiError::AlreadyExists { kind: kind.into(), name: name.into() },
            StoreError::NotFound(_) => ApiError::not_found(kind, name),
            StoreError::Conflict { actual, expected, .. } => ApiError::Conflict(format!(
                "{kind} {name:?} was modified: you sent resourceVersion {expected}, it is now {}; read it again and retry",
                actual.map_or("deleted".to_string(), |r| r.to_string())
            )),
            StoreError::Compacted { .. } | StoreError::FutureRevision { .. } => ApiError::Gone(error.to_string()),
            StoreError::InvalidKey(_) => ApiError::BadRequest(error.to_string()),
            StoreError::Backend(_) | StoreError::Closed => ApiError::Unavailable(error.to_string()),
        }
    }

    pub fn status(&self) -> Status {
        let reason = match self {
            ApiError::Unauthorized(_) => StatusReason::Unauthorized,
            ApiError::Forbidden(_) => StatusReason::Forbidden,
            ApiError::NotFound { .. } | ApiError::Missing(_) => StatusReason::NotFound,
            ApiError::AlreadyExists { .. } => StatusReason::AlreadyExists,
            ApiError::Conflict(_) => StatusReason::Conflict,
            ApiError::Invalid { .. } => StatusReason::Invalid,
            ApiError::BadRequest(_) => StatusReason::BadRequest,
            ApiError::Gone(_) => StatusReason::Gone,
            ApiError::Internal(_) => StatusReason::InternalError,
            ApiError::Unavailable(_) | ApiError::Fenced(_) => StatusReason::ServiceUnavailable,
            ApiError::MethodNotAllowed(_) => StatusReason::MethodNotAllowed,
            ApiError::PayloadTooLarge(_) => StatusReason::PayloadTooLarge,
            ApiError::TooManyRequests(_) => StatusReason::TooManyRequests,
        };
        let mut status = Status::new(reason, self.to_string());
        if let ApiError::Invalid { errors, .. } = self {
            status.causes = errors.errors.clone();
        }
        status
    }
}

/// The one place an object error gets its HTTP status.
impl From<ObjectsError> for ApiError {
    fn from(error: ObjectsError) -> Self {
        let message = error.to_string();
        match error {
            ObjectsError::NotFound { kind, name } => ApiError::NotFound { kind, name },
            ObjectsError::AlreadyExists { kind, name } => ApiError::AlreadyExists { kind, name },
            ObjectsError::Conflict { .. } | ObjectsError::GuardMoved { .. } | ObjectsError::Held(_) => {
                ApiError::Conflict(message)
            }
            ObjectsError::Fenced { .. } => ApiError::Fenced(message),
            ObjectsError::Invalid { kind, name, errors } => ApiError::Invalid { kind, name, errors },
            ObjectsError::BadRequest(_) => ApiError::BadRequest(message),
            ObjectsError::Corrupt { .. } => ApiError::Internal(message),
            ObjectsError::Store(store) => ApiError::from_store("object", "", store),
        }
    }
}

impl From<EvictionError> for ApiError {
    fn from(error: EvictionError) -> Self {
        match error {
            EvictionError::Refused { .. } => ApiError::TooManyRequests(error.to_string()),
            EvictionError::Contended(_) => ApiError::Conflict(error.to_string()),
            EvictionError::Objects(objects) => objects.into(),
        }
    }
}

impl From<RoleChangeError> for ApiError {
    fn from(error: RoleChangeError) -> Self {
        match error {
            RoleChangeError::Refused(RoleRefusal::NoSuchNode(name)) => ApiError::not_found(NodeSpec::KIND, &name),
            RoleChangeError::Refused(_) | RoleChangeError::Contended(_) => ApiError::Conflict(error.to_string()),
            RoleChangeError::Objects(objects) => objects.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::from_store("object", "", error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A 503 is an answer (this replica does not lead, the store is
        // away for now: ask again or elsewhere), not a fault of the server.
        match status.code {
            503 => tracing::warn!(error = %self, "request not served here now"),
            500.. => tracing::error!(error = %self, "request failed"),
            _ => {}
        }
        let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, Json(status)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_the_api_statuses() {
        let code = |e: StoreError| ApiError::from_store("Node", "n1", e).status().code;
        assert_eq!(code(StoreError::Compacted { requested: 3, compacted: 9 }), 410, "relist after compaction");
        assert_eq!(
            code(StoreError::FutureRevision { requested: 99, head: 9 }),
            410,
            "relist: another store's revision"
        );
        assert_eq!(code(StoreError::Conflict { key: "k".into(), expected: 1, actual: Some(2) }), 409);
        assert_eq!(code(StoreError::AlreadyExists("k".into())), 409);
        assert_eq!(code(StoreError::NotFound("k".into())), 404);
        assert_eq!(code(StoreError::Backend("disk".into())), 503);
        let invalid = ApiError::invalid("Node", "n1", ValidationErrors::single("spec.role", "bad")).status();
        assert_eq!((invalid.code, invalid.causes[0].field.as_str()), (422, "spec.role"));
    }

    #[test]
    fn object_errors_map_to_the_api_statuses() {
        let code = |e: ObjectsError| ApiError::from(e).status().code;
        let (kind, name) = ("Node".to_string(), "n1".to_string());
        assert_eq!(code(ObjectsError::not_found("Node", "n1")), 404);
        assert_eq!(code(ObjectsError::AlreadyExists { kind: kind.clone(), name: name.clone() }), 409);
        assert_eq!(
            code(ObjectsError::Conflict { kind: kind.clone(), name: name.clone(), expected: 1, actual: None }),
            409
        );
        assert_eq!(code(ObjectsError::GuardMoved { kind: kind.clone(), name: name.clone() }), 409);
        assert_eq!(code(ObjectsError::Fenced { term: 3, kind, name }), 503);
        assert_eq!(code(ObjectsError::Corrupt { key: "k".into(), reason: "x".into() }), 500);
        assert_eq!(code(ObjectsError::Store(StoreError::Compacted { requested: 3, compacted: 9 })), 410);
    }
}
