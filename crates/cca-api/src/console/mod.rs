//! The web console: its page and assets at `/ui` (embedded in the
//! binary, [`assets`]), and the routes under `/v1/console/` that answer
//! each page with a summary built on the server ([`views`]) — once, or
//! with `?live=true` as server-sent events of the page's view each time
//! it changes ([`live`]). The browser never receives a whole list or a
//! raw watch: a view's size does not grow with the cluster. The diff page
//! compiles a pasted program with the compiler the binary hands the
//! server ([`Compiler`]) and plans it as `POST /v1/diff` does.

mod assets;
mod live;
pub mod views;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::PoisonError;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cca_control::View;
use cca_model::Revision;
use cca_model::access::{Action, Resource};
use cca_model::spec::Program;
use serde::{Deserialize, Serialize};

pub(crate) use assets::{asset, index};

use crate::authz::{Lens, filter_by_service};
use crate::error::{ApiError, ApiResult, JsonBody, QueryArgs};
use crate::routes::reads::fresh_view;
use crate::state::ApiState;
use crate::types::ApplyReport;

/// Events a page shows under its view (the newest).
const PAGE_EVENTS: usize = 20;
/// Events the events page shows.
const STREAM_EVENTS: usize = 200;

/// Compiles the text of a `.cca` program for the diff page. The `cca`
/// binary implements it with `cca-dsl`, so that the API stays free of the
/// language: everything after compiling goes the way of a `Program` sent
/// by the CLI.
pub trait Compiler: Send + Sync + std::fmt::Debug + 'static {
    /// The program, or the compiler's report of every error with its line.
    fn compile(&self, source: &str) -> Result<Program, String>;
}

/// Query of the console's reads.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    /// Zero-based page of the view's list.
    #[serde(default)]
    page: usize,
    /// Only names containing this.
    #[serde(default)]
    q: String,
    /// Answer with server-sent events of the view as it changes.
    #[serde(default)]
    live: bool,
}

/// Views already built, by what they show and the revision they show it
/// at: the feeds of many tabs on one page build it once per change.
#[derive(Debug, Default)]
pub(crate) struct BuiltViews {
    views: std::sync::Mutex<HashMap<String, BuiltView>>,
}

/// One view's JSON and the revision it was built at.
type BuiltView = (Revision, Arc<Vec<u8>>);

/// Views kept at most; past it, only those of the newest revision stay.
const MAX_BUILT_VIEWS: usize = 1_024;

impl BuiltViews {
    fn get(&self, key: &str, revision: Revision) -> Option<Arc<Vec<u8>>> {
        let views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        views
            .get(key)
            .filter(|(built_at, _)| *built_at == revision)
            .map(|(_, json)| Arc::clone(json))
    }

    fn put(&self, key: &str, revision: Revision, json: Arc<Vec<u8>>) {
        let mut views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        if views.len() >= MAX_BUILT_VIEWS && !views.contains_key(key) {
            views.retain(|_, (built_at, _)| *built_at >= revision);
            if views.len() >= MAX_BUILT_VIEWS {
                views.clear();
            }
        }
        views.insert(key.to_owned(), (revision, json));
    }
}

/// Which events a page shows, and whom for.
pub(crate) struct EventFeed {
    /// Their subject's prefix (`""`: every event).
    subject: String,
    limit: usize,
    lens: Option<Lens>,
}

type Build<T> = Arc<dyn Fn(&View) -> ApiResult<T> + Send + Sync>;

/// What a page's view is built from: the key it is kept under (what it
/// shows, and for whom when a lens filters it) and how to build it.
pub(crate) struct Builder<T> {
    key: String,
    build: Build<T>,
}

impl<T> Clone for Builder<T> {
    fn clone(&self) -> Self {
        Builder {
            key: self.key.clone(),
            build: Arc::clone(&self.build),
        }
    }
}

fn builder<T>(
    key: String,
    build: impl Fn(&View) -> ApiResult<T> + Send + Sync + 'static,
) -> Builder<T> {
    Builder {
        key,
        build: Arc::new(build),
    }
}

/// Answers with the view `build` makes and its events: once, or live.
async fn answer<T: Serialize + Send + 'static>(
    state: &ApiState,
    live: bool,
    feed: EventFeed,
    build: Builder<T>,
) -> ApiResult<Response> {
    if live {
        return live::stream(state, feed, build);
    }
    let view = fresh_view(state).await?;
    let content = render(state, &view, &feed, build).await?;
    let mut response = ([(header::CONTENT_TYPE, "application/json")], content).into_response();
    if let Ok(revision) = HeaderValue::from_str(&view.revision.to_string()) {
        response.headers_mut().insert("x-cca-revision", revision);
    }
    Ok(response)
}

/// The JSON of `builder`'s view of `view` and the feed's events: the
/// view as built for another feed at this revision, or built now, off
/// the async threads (at 100,000 instances an overview takes tens of
/// milliseconds).
async fn render<T: Serialize + Send + 'static>(
    state: &ApiState,
    view: &Arc<View>,
    feed: &EventFeed,
    builder: Builder<T>,
) -> ApiResult<Vec<u8>> {
    let built = state.console_views();
    let json = match built.get(&builder.key, view.revision) {
        Some(json) => json,
        None => {
            let snapshot = Arc::clone(view);
            let build = Arc::clone(&builder.build);
            let json = tokio::task::spawn_blocking(move || {
                build(&snapshot).and_then(|view| encode(&view))
            })
            .await
            .map_err(|_| ApiError::internal("building the console's view failed unexpectedly"))??;
            let json = Arc::new(json);
            built.put(&builder.key, view.revision, Arc::clone(&json));
            json
        }
    };
    let mut events = crate::routes::events::recent_about(state, &feed.subject, feed.limit).await?;
    crate::routes::events::keep_visible(state, feed.lens.as_ref(), &mut events);
    let mut content = Vec::with_capacity(json.len() + 256);
    content.extend_from_slice(b"{\"view\":");
    content.extend_from_slice(&json);
    content.extend_from_slice(b",\"events\":");
    content.extend_from_slice(&encode(&events)?);
    content.push(b'}');
    Ok(content)
}

fn encode(value: &impl Serialize) -> ApiResult<Vec<u8>> {
    serde_json::to_vec(value)
        .map_err(|error| ApiError::internal(format!("encoding the console's view: {error}")))
}

/// Whom a view filtered by a lens is built for (`*`: everyone sees the
/// same).
fn viewer(caller: Option<&crate::auth::Caller>, lens: Option<&Lens>) -> String {
    match (caller, lens) {
        (Some(caller), Some(_)) => caller.identity.to_string(),
        _ => "*".to_owned(),
    }
}

fn feed(subject: impl Into<String>, limit: usize, lens: Option<Lens>) -> EventFeed {
    EventFeed {
        subject: subject.into(),
        limit,
        lens,
    }
}

fn event_lens(state: &ApiState, caller: Option<&crate::auth::Caller>) -> Option<Lens> {
    Lens::of(state, caller, Resource::Event)
}

/// The names of the services `lens` shows (`None`: every one).
fn shown_services(lens: Option<&Lens>, view: &View) -> Option<BTreeSet<String>> {
    let lens = lens?;
    let mut names: Vec<String> = view.services.keys().cloned().collect();
    filter_by_service(Some(lens), view, &mut names, |name| Some(name.clone()));
    Some(names.into_iter().collect())
}

fn shows(shown: Option<&BTreeSet<String>>, service: &str) -> bool {
    shown.is_none_or(|names| names.contains(service))
}

type CallerExtension = Option<axum::Extension<crate::auth::Caller>>;

/// `GET /v1/console/overview`.
pub(crate) async fn overview(
    State(state): State<ApiState>,
    caller: CallerExtension,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let lens = Lens::of(&state, caller.as_deref(), Resource::Service);
    let key = format!("overview|{}", viewer(caller.as_deref(), lens.as_ref()));
    let events = feed("", PAGE_EVENTS, event_lens(&state, caller.as_deref()));
    let build = builder(key, move |view| {
        let shown = shown_services(lens.as_ref(), view);
        Ok(views::overview(view, |name| shows(shown.as_ref(), name)))
    });
    answer(&state, query.live, events, build).await
}

/// `GET /v1/console/services`.
pub(crate) async fn services(
    State(state): State<ApiState>,
    caller: CallerExtension,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let lens = Lens::of(&state, caller.as_deref(), Resource::Service);
    let events = feed(
        "service/",
        PAGE_EVENTS,
        event_lens(&state, caller.as_deref()),
    );
    let PageQuery { page, q, live } = query;
    // The filter quoted, so that no text in it reads as another key's.
    let key = format!(
        "services|{}|{page}|{q:?}",
        viewer(caller.as_deref(), lens.as_ref())
    );
    let build = builder(key, move |view| {
        let shown = shown_services(lens.as_ref(), view);
        Ok(views::services(view, &q, page, |name| {
            shows(shown.as_ref(), name)
        }))
    });
    answer(&state, live, events, build).await
}

/// `GET /v1/console/services/{name}`.
pub(crate) async fn service(
    State(state): State<ApiState>,
    caller: CallerExtension,
    Path(name): Path<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let object = Named::new("service", name, "no service named");
    object_page(&state, caller, object, query, views::service).await
}

/// `GET /v1/console/nodes`.
pub(crate) async fn nodes(
    State(state): State<ApiState>,
    caller: CallerExtension,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let events = feed("node/", PAGE_EVENTS, event_lens(&state, caller.as_deref()));
    let PageQuery { page, q, live } = query;
    let key = format!("nodes|{page}|{q:?}");
    let build = builder(key, move |view| Ok(views::nodes(view, &q, page)));
    answer(&state, live, events, build).await
}

/// `GET /v1/console/nodes/{name}`.
pub(crate) async fn node(
    State(state): State<ApiState>,
    caller: CallerExtension,
    Path(name): Path<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let object = Named::new("node", name, "no node named");
    object_page(&state, caller, object, query, views::node).await
}

/// `GET /v1/console/instances/{id}`.
pub(crate) async fn instance(
    State(state): State<ApiState>,
    caller: CallerExtension,
    Path(id): Path<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let object = Named::new("instance", id, "no instance");
    object_page(&state, caller, object, query, |view, id, _| {
        views::instance(view, id)
    })
    .await
}

/// One named object a page is about.
struct Named {
    /// `service`, `node`, `instance`: its events' subjects start so.
    kind: &'static str,
    name: String,
    /// What a 404 says before the name.
    missing: &'static str,
}

impl Named {
    fn new(kind: &'static str, name: String, missing: &'static str) -> Self {
        Named {
            kind,
            name,
            missing,
        }
    }
}

/// The page of one named object (404 naming it when there is none) with
/// the events about it.
async fn object_page<T: Serialize + Send + 'static>(
    state: &ApiState,
    caller: CallerExtension,
    object: Named,
    query: PageQuery,
    build: fn(&View, &str, usize) -> Option<T>,
) -> ApiResult<Response> {
    let events = feed(
        format!("{}/{}", object.kind, object.name),
        PAGE_EVENTS,
        event_lens(state, caller.as_deref()),
    );
    let page = query.page;
    let key = format!("{}/{}|{page}", object.kind, object.name);
    let build = builder(key, move |view| {
        build(view, &object.name, page)
            .ok_or_else(|| ApiError::not_found(format!("{} `{}`", object.missing, object.name)))
    });
    answer(state, query.live, events, build).await
}

/// `GET /v1/console/events`: the newest events, whose subject starts with
/// `q` when given.
pub(crate) async fn events(
    State(state): State<ApiState>,
    caller: CallerExtension,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> ApiResult<Response> {
    let events = feed(
        query.q.clone(),
        STREAM_EVENTS,
        event_lens(&state, caller.as_deref()),
    );
    let build = builder("events".to_owned(), |_| Ok(()));
    answer(&state, query.live, events, build).await
}

/// Body of the diff and apply of a pasted program.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PastedProgram {
    /// The text of one `.cca` file.
    source: String,
    /// Delete the services (of the caller's tenant) the program omits.
    #[serde(default)]
    prune: bool,
}

/// `POST /v1/console/diff`: what applying the pasted program would
/// change.
pub(crate) async fn diff(
    State(state): State<ApiState>,
    caller: CallerExtension,
    JsonBody(pasted): JsonBody<PastedProgram>,
) -> ApiResult<Json<ApplyReport>> {
    plan(&state, caller, pasted, Action::Read, true).await
}

/// `POST /v1/console/apply`: applies the pasted program, as `cca apply`.
pub(crate) async fn apply(
    State(state): State<ApiState>,
    caller: CallerExtension,
    JsonBody(pasted): JsonBody<PastedProgram>,
) -> ApiResult<Json<ApplyReport>> {
    plan(&state, caller, pasted, Action::Write, false).await
}

async fn plan(
    state: &ApiState,
    caller: CallerExtension,
    pasted: PastedProgram,
    action: Action,
    dry_run: bool,
) -> ApiResult<Json<ApplyReport>> {
    let compiler = state.compiler().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server has no compiler for pasted programs: compile with \
             `cca apply --dry-run FILE` instead",
        )
    })?;
    let program = compiler.compile(&pasted.source).map_err(|report| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the program has errors; nothing was applied:\n{report}"),
        )
    })?;
    let program = crate::routes::ops::for_tenant(state, caller, action, None, program)?;
    crate::apply::apply_program(state, &program, pasted.prune, dry_run)
        .await
        .map(Json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Arc<Vec<u8>> {
        Arc::new(text.as_bytes().to_vec())
    }

    #[test]
    fn a_built_view_serves_its_revision_only() {
        let built = BuiltViews::default();
        built.put("overview|*", 7, json("seven"));
        assert_eq!(built.get("overview|*", 7), Some(json("seven")));
        assert_eq!(
            built.get("overview|*", 8),
            None,
            "a newer revision builds again"
        );
        assert_eq!(
            built.get("overview|user:alice", 7),
            None,
            "another viewer's"
        );
        built.put("overview|*", 8, json("eight"));
        assert_eq!(built.get("overview|*", 7), None, "replaced");
        assert_eq!(built.get("overview|*", 8), Some(json("eight")));
    }

    #[test]
    fn built_views_stay_bounded_keeping_the_newest() {
        let built = BuiltViews::default();
        for n in 0..MAX_BUILT_VIEWS {
            built.put(&format!("old/{n}"), 1, json("old"));
        }
        built.put("new", 2, json("new"));
        assert_eq!(built.get("new", 2), Some(json("new")));
        assert_eq!(built.get("old/0", 1), None, "older views made room");
        let kept = built
            .views
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert!(kept <= MAX_BUILT_VIEWS, "{kept}");
    }
}
