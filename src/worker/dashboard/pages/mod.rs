//! One module per view of the dashboard; each handler reads its rows through the store's
//! time-limited queries and renders them with [`super::layout`].

pub(super) mod charts;
pub(super) mod job;
pub(super) mod jobs;
pub(super) mod overview;
pub(super) mod pipeline;
pub(super) mod scheduled;
pub(super) mod workers;
