//! Dashboard pages of barriers and locks: Barriers (every barrier with its
//! newest round, etcd-style holds, DoubleBarriers), Barrier (its hold and
//! its rounds with each participant's arrival; a barrier that is only held
//! shows its hold), Locks (held locks and leaders). With JavaScript the
//! pages follow the event feed and swap their content in place (live.js,
//! `data-live-swap`), with countdowns to round deadlines and lease ends;
//! without it a page with an open round reloads every two seconds.

use std::sync::Arc;

use askama::Template;
use askama_web::WebTemplate;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::Layout;
use super::UiForm;
use super::filters;
use muster_api::Name;

use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::barriers::{BarrierConfigView, BarrierError, DoubleBarrier, Hold, Round, Verdict};
use crate::config::Role;
use crate::error::Result;
use crate::http::Path;
use crate::locks::Locks;
use crate::locks::{Leadership, LockInfo};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/barriers", get(barriers_page))
        .route("/barriers/{name}", get(barrier_page))
        .route("/locks", get(locks_page))
        .route("/ui/locks/{name}/break", post(ui_break_lock))
}

/// Page helpers of a barrier's configuration (a trait: the type is the
/// contract crate's).
pub trait ConfigHuman {
    /// The round timeout as a human duration.
    fn timeout_human(&self) -> String;
}

impl ConfigHuman for BarrierConfigView {
    fn timeout_human(&self) -> String {
        super::human_duration(self.timeout_ms as i64)
    }
}

/// One participant in one round, ready to print.
pub struct Cell {
    pub node: String,
    /// arrived, late, missing (decided without it) or waiting (round open).
    pub state: &'static str,
    /// Redis ms of its arrival, if any.
    pub at: Option<i64>,
    /// Milliseconds after the round opened.
    pub offset_ms: Option<i64>,
}

/// A round with its participants laid out.
pub struct RoundView {
    pub round: Round,
    pub cells: Vec<Cell>,
    pub open: bool,
}

impl RoundView {
    fn new(round: Round) -> Self {
        let open = round.verdict == Verdict::Pending;
        let cells = round
            .participants
            .iter()
            .map(|p| {
                let arrived = round.arrived_at(p);
                let late = round.late.iter().find(|a| a.node == *p).map(|a| a.at);
                let (state, at) = match (arrived, late) {
                    (Some(t), _) => ("arrived", Some(t)),
                    (None, Some(t)) => ("late", Some(t)),
                    (None, None) if open => ("waiting", None),
                    (None, None) => ("missing", None),
                };
                Cell {
                    node: p.clone(),
                    state,
                    at,
                    offset_ms: at.map(|t| t - round.opened_at),
                }
            })
            .collect();
        RoundView { round, cells, open }
    }
}

pub struct BarrierRow {
    pub config: BarrierConfigView,
    pub latest: Option<RoundView>,
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/barriers.html")]
pub struct BarriersPage {
    pub layout: Layout,
    pub barriers: Vec<BarrierRow>,
    /// Every etcd-style hold in force, configured barrier or not.
    pub holds: Vec<Hold>,
    pub doubles: Vec<DoubleBarrier>,
    pub live: bool,
}

async fn barriers_page(State(s): State<AppState>, caller: ReadCaller) -> Result<BarriersPage> {
    let configs = s.barriers.list().await?;
    let names: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
    let latest = s.barriers.latest_rounds(&names).await?;
    let barriers: Vec<BarrierRow> = configs
        .into_iter()
        .zip(latest)
        .map(|(config, r)| BarrierRow {
            config,
            latest: r.map(RoundView::new),
        })
        .collect();
    let holds = s.barriers.holds().await?;
    let doubles = s.barriers.double_barriers().await?;
    let live = barriers.iter().any(|b| b.latest.as_ref().is_some_and(|r| r.open));
    Ok(BarriersPage {
        layout: Layout::new(&s, Some(&caller.0), "Barriers", "Barriers"),
        barriers,
        holds,
        doubles,
        live,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/barrier.html")]
pub struct BarrierPage {
    pub layout: Layout,
    pub name: String,
    /// None for a barrier that is only held (etcd-style, never configured).
    pub config: Option<BarrierConfigView>,
    pub hold: Hold,
    pub rounds: Vec<RoundView>,
    pub live: bool,
}

async fn barrier_page(State(s): State<AppState>, caller: ReadCaller, Path(name): Path<Name>) -> Result<BarrierPage> {
    let config = s.barriers.get(&name).await?;
    let (hold, _) = s.barriers.hold_state(&name).await?;
    if config.is_none() && !hold.held {
        return Err(BarrierError::NotFound(name.into_string()).into());
    }
    let rounds: Vec<RoundView> = match config {
        Some(_) => s
            .barriers
            .rounds(&name, 50)
            .await?
            .into_iter()
            .map(RoundView::new)
            .collect(),
        None => Vec::new(),
    };
    let live = rounds.iter().any(|r| r.open);
    Ok(BarrierPage {
        layout: Layout::new(&s, Some(&caller.0), &format!("Barrier {name}"), "Barriers"),
        name: name.into_string(),
        config,
        hold,
        rounds,
        live,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/locks.html")]
pub struct LocksPage {
    pub layout: Layout,
    pub locks: Vec<LockInfo>,
    pub elections: Vec<Leadership>,
}

async fn locks_page(State(s): State<AppState>, caller: ReadCaller) -> Result<LocksPage> {
    Ok(LocksPage {
        layout: Layout::new(&s, Some(&caller.0), "Locks", "Locks"),
        locks: s.locks.list().await?,
        elections: s.locks.elections().await?,
    })
}

/// Breaks a held lock (its holder's token dies; the next waiter gets it), as
/// `DELETE /api/v1/locks/{name}` does.
async fn ui_break_lock(State(locks): State<Arc<Locks>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    locks.release(&f.name, None, &f.caller.name).await?;
    Ok(Redirect::to("/locks").into_response())
}
