//! What an admin can do from the dashboard: retry a dead job, cancel a job or a whole
//! pipeline, retry or discard dead jobs (some, or every one of a queue). Every handler takes
//! [`Admin`], so none runs for anyone else; each answers with a redirect back to the page it
//! came from, carrying what it did as a [`Done`] code and a count.

use super::auth::Admin;
use super::layout::failed;
use super::q;
use crate::worker::listener::LimitedBody;
use crate::worker::Shared;
use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::Form;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::sync::Arc;
use tracing::info;

/// The largest form accepted (a dead-letter page's 50 selected ids fit with room to spare).
const FORM_BODY_LIMIT: usize = 64 * 1024;

/// A form body: read with the listener's limits ([`LimitedBody`]: `413` over
/// [`FORM_BODY_LIMIT`], `408` when it arrives too slowly), then decoded by axum's [`Form`]
/// (repeated fields such as `id=a&id=b` into a `Vec`).
pub(super) struct ActionForm<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ActionForm<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (head, body) = req.into_parts();
        let limited = Request::from_parts(head.clone(), body);
        let LimitedBody(bytes) =
            LimitedBody::<FORM_BODY_LIMIT>::from_request(limited, state).await?;
        let read = Request::from_parts(head, Body::from(bytes));
        match Form::<T>::from_request(read, state).await {
            Ok(Form(form)) => Ok(ActionForm(form)),
            Err(e) => Err(e.into_response()),
        }
    }
}

/// What an action did, as a code and a count in the redirect's query (never free text from
/// the URL, so nobody can put their own words in the banner).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Done {
    Retried,
    Discarded,
    NotDead,
    Cancelled,
    AlreadyFinished,
    NoneSelected,
    NoQueue,
    WrongToken,
    Paused,
    Resumed,
    NotPaused,
    NotServed,
    Bulk,
    Skipped,
    NotSkipped,
}

const DONE: [(Done, &str); 15] = [
    (Done::Retried, "retried"),
    (Done::Discarded, "discarded"),
    (Done::NotDead, "not-dead"),
    (Done::Cancelled, "cancelled"),
    (Done::AlreadyFinished, "finished"),
    (Done::NoneSelected, "none-selected"),
    (Done::NoQueue, "no-queue"),
    (Done::WrongToken, "wrong-token"),
    (Done::Paused, "paused"),
    (Done::Resumed, "resumed"),
    (Done::NotPaused, "not-paused"),
    (Done::NotServed, "not-served"),
    (Done::Bulk, "bulk"),
    (Done::Skipped, "skipped"),
    (Done::NotSkipped, "not-skipped"),
];

impl Done {
    /// The action a `done=` code names (`None`: not one of ours).
    pub(super) fn from_code(code: &str) -> Option<Done> {
        DONE.iter().find(|(_, c)| *c == code).map(|(d, _)| *d)
    }

    fn code(self) -> &'static str {
        DONE.iter()
            .find(|(d, _)| *d == self)
            .map(|(_, c)| *c)
            .unwrap_or("")
    }

    /// What the banner says.
    pub(super) fn text(self, n: u64) -> String {
        match self {
            Done::Retried => format!("{n} dead job(s) retried"),
            Done::Discarded => format!("{n} dead job(s) discarded"),
            Done::NotDead => "not retried: the job is not dead".into(),
            Done::Cancelled if n > 1 => format!("{n} jobs cancelled"),
            Done::Cancelled => "cancelled".into(),
            Done::AlreadyFinished => "not cancelled: the job had already finished".into(),
            Done::NoneSelected => "select at least one job".into(),
            Done::NoQueue => "pick a queue to act on all of its dead jobs".into(),
            Done::WrongToken => "wrong admin token".into(),
            Done::Paused => "queue paused: nothing new starts on any worker until resumed".into(),
            Done::Resumed => "queue resumed".into(),
            Done::NotPaused => "not resumed: the queue is not paused".into(),
            Done::Bulk => format!("{n} jobs changed by the bulk action (recorded in bulk_actions)"),
            Done::Skipped => {
                "skipped in its key's order: the key's later jobs run on (the job stays dead)"
                    .into()
            }
            Done::NotSkipped => {
                "not skipped: the job holds no key's order (not dead, no key, never parked, or \
                 skipped already)"
                    .into()
            }
            Done::NotServed => {
                "not paused: no running worker serves this queue (`jobwarden queues pause \
                 --force` pauses it anyway)"
                    .into()
            }
        }
    }
}

/// The redirect back to `to`, saying what was done.
pub(super) fn back(to: &str, done: Done, n: usize) -> Response {
    let sep = if to.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{to}{sep}done={}&n={n}", done.code())).into_response()
}

/// A form that names one job (or the pipeline it belongs to).
#[derive(Deserialize)]
pub(super) struct JobForm {
    #[serde(default)]
    id: String,
}

impl JobForm {
    /// The job page to go back to.
    fn page(&self) -> String {
        format!("/job?id={}", q(&self.id))
    }
}

pub(super) async fn job_retry(
    _: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<JobForm>,
) -> Response {
    let ids = std::slice::from_ref(&f.id);
    match shared.store.job_retry_dead(Some(ids), None).await {
        Ok(ids) if ids.is_empty() => back(&f.page(), Done::NotDead, 0),
        Ok(_) => {
            info!(job.id = %f.id, "dashboard: dead job retried");
            back(&f.page(), Done::Retried, 1)
        }
        Err(e) => failed(e),
    }
}

/// Lets an ordered key's dead job go (`skip_key_job()`), recorded with the admin's name.
pub(super) async fn job_skip(
    admin: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<JobForm>,
) -> Response {
    match shared.store.key_job_skip(&f.id, &admin.who()).await {
        Ok(key) => {
            info!(job.id = %f.id, job.key = %key, "dashboard: dead job skipped in its key's order");
            back(&f.page(), Done::Skipped, 1)
        }
        Err(e) if e.rejected_data().is_some() => back(&f.page(), Done::NotSkipped, 0),
        Err(e) => failed(e),
    }
}

pub(super) async fn job_cancel(
    _: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<JobForm>,
) -> Response {
    match shared.store.job_cancel(&f.id).await {
        Ok(Some(was)) => {
            info!(job.id = %f.id, was = %was, "dashboard: job cancelled");
            back(&f.page(), Done::Cancelled, 1)
        }
        Ok(None) => back(&f.page(), Done::AlreadyFinished, 0),
        Err(e) => failed(e),
    }
}

pub(super) async fn pipeline_cancel(
    _: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<JobForm>,
) -> Response {
    match shared.store.pipeline_cancel(&f.id).await {
        Ok(ids) => {
            info!(job.id = %f.id, jobs = ids.len(), "dashboard: pipeline cancelled");
            let to = format!("/pipeline?id={}", q(&f.id));
            back(&to, Done::Cancelled, ids.len())
        }
        Err(e) => failed(e),
    }
}

/// The dead-letter page's form: the checked ids, or `all` of its queue. An empty field counts
/// as absent (the page always sends `queue`, empty when no queue is picked).
#[derive(Deserialize, Default, Debug)]
pub(super) struct DeadForm {
    queue: Option<String>,
    all: Option<String>,
    #[serde(default)]
    id: Vec<String>,
}

/// Which dead jobs an action is for.
#[derive(Debug, PartialEq)]
enum Selection {
    Ids(Vec<String>),
    Queue(String),
}

impl DeadForm {
    fn queue(&self) -> Option<&str> {
        self.queue.as_deref().filter(|q| !q.is_empty())
    }

    /// The checked ids, or with `all`, every dead job of its queue.
    fn selection(&self) -> Result<Selection, Done> {
        if self.all.as_deref().is_some_and(|a| !a.is_empty()) {
            return self
                .queue()
                .map(|q| Selection::Queue(q.to_string()))
                .ok_or(Done::NoQueue);
        }
        let ids: Vec<String> = self.id.iter().filter(|i| !i.is_empty()).cloned().collect();
        if ids.is_empty() {
            return Err(Done::NoneSelected);
        }
        Ok(Selection::Ids(ids))
    }

    /// The dead-letter page to go back to (of the form's queue, if any).
    fn page(&self) -> String {
        match self.queue() {
            Some(qn) => format!("/dead?queue={}", q(qn)),
            None => "/dead".to_string(),
        }
    }
}

pub(super) async fn dead_retry(
    _: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<DeadForm>,
) -> Response {
    dead_action(&shared, &f, false).await
}

pub(super) async fn dead_discard(
    _: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<DeadForm>,
) -> Response {
    dead_action(&shared, &f, true).await
}

async fn dead_action(shared: &Shared, f: &DeadForm, discard: bool) -> Response {
    let (ids, queue) = match f.selection() {
        Ok(Selection::Ids(ids)) => (Some(ids), None),
        Ok(Selection::Queue(q)) => (None, Some(q)),
        Err(why) => return back(&f.page(), why, 0),
    };
    let store = &shared.store;
    let done = if discard {
        store
            .job_discard_dead(ids.as_deref(), queue.as_deref())
            .await
    } else {
        store.job_retry_dead(ids.as_deref(), queue.as_deref()).await
    };
    match done {
        Ok(ids) => {
            let (verb, done) = if discard {
                ("discarded", Done::Discarded)
            } else {
                ("retried", Done::Retried)
            };
            info!(jobs = ids.len(), "dashboard: dead jobs {verb}");
            back(&f.page(), done, ids.len())
        }
        Err(e) => failed(e),
    }
}

/// The overview's pause and resume forms: the queue, and why (for a pause).
#[derive(Deserialize)]
pub(super) struct QueueForm {
    #[serde(default)]
    queue: String,
    #[serde(default)]
    reason: String,
}

pub(super) async fn queue_pause(
    admin: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<QueueForm>,
) -> Response {
    let reason = Some(f.reason.trim()).filter(|r| !r.is_empty());
    match shared
        .store
        .pause_queue(&f.queue, &admin.who(), reason, false)
        .await
    {
        Ok(_) => {
            info!(queue = %f.queue, "dashboard: queue paused");
            back("/", Done::Paused, 1)
        }
        // Not a queue any running worker serves (or not a queue name at all).
        Err(e) if e.rejected_data().is_some() => back("/", Done::NotServed, 0),
        Err(e) => failed(e),
    }
}

pub(super) async fn queue_resume(
    _: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<QueueForm>,
) -> Response {
    match shared.store.resume_queue(&f.queue).await {
        Ok(Some(_)) => {
            info!(queue = %f.queue, "dashboard: queue resumed");
            back("/", Done::Resumed, 1)
        }
        Ok(None) => back("/", Done::NotPaused, 0),
        Err(e) => failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn form(body: &'static str) -> DeadForm {
        let req = Request::builder()
            .method("POST")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        match ActionForm::<DeadForm>::from_request(req, &()).await {
            Ok(ActionForm(f)) => f,
            Err(r) => panic!("{body}: {}", r.status()),
        }
    }

    #[tokio::test]
    async fn a_dead_letter_form_names_ids_or_a_whole_queue() {
        let f = form("queue=&id=a&id=b").await;
        assert_eq!(
            f.selection(),
            Ok(Selection::Ids(vec!["a".into(), "b".into()]))
        );
        assert_eq!(f.page(), "/dead");
        let f = form("queue=email&all=1").await;
        assert_eq!(f.selection(), Ok(Selection::Queue("email".into())));
        assert_eq!(f.page(), "/dead?queue=email");
        assert_eq!(form("all=1").await.selection(), Err(Done::NoQueue));
        assert_eq!(
            form("queue=email").await.selection(),
            Err(Done::NoneSelected)
        );
        assert_eq!(
            form("queue=email&id=").await.selection(),
            Err(Done::NoneSelected)
        );
    }

    #[tokio::test]
    async fn a_form_over_the_limit_is_refused_before_it_is_read() {
        let req = Request::builder()
            .method("POST")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("content-length", (FORM_BODY_LIMIT + 1).to_string())
            .body(Body::empty())
            .unwrap();
        let Err(r) = ActionForm::<DeadForm>::from_request(req, &()).await else {
            panic!("accepted");
        };
        assert_eq!(r.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn every_done_code_reads_back_as_itself() {
        for (d, code) in DONE {
            assert_eq!(Done::from_code(code), Some(d));
            assert_eq!(d.code(), code);
        }
        assert_eq!(Done::from_code("bogus"), None);
        assert_eq!(Done::Cancelled.text(2), "2 jobs cancelled");
    }
}
