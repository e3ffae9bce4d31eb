//! `POST /api/v1/members/{name}/eviction`: a voluntary disruption of one
//! member, asked of its budgets (`crate::eviction`); admins only.

use axum::Json;
use axum::extract::State;
use herd_core::api::Eviction;
use herd_core::authz::Verb;

use super::resources::WriteQuery;
use super::{ApiName, ApiQuery, AppState, Caller};
use crate::error::ApiError;

pub async fn evict(
    State(state): State<AppState>,
    caller: Caller,
    ApiName(name): ApiName,
    ApiQuery(query): ApiQuery<WriteQuery>,
) -> Result<Json<Eviction>, ApiError> {
    caller.may(Verb::Update, "members", Some(&name))?;
    Ok(Json(crate::eviction::evict(&state.objects, &state.events, &name, query.dry_run()?).await?))
}
