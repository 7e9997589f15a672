//! The `console` scenario (by name only: it needs Chromium): the web
//! console in headless Chromium against the deployed cluster (5,000 nodes
//! and 100,000 instances at full size). It times each page's first view in
//! the page itself (from the navigation to the view drawn), the live
//! update of a service's page after a scale (from the API's answer to the
//! page showing it), and measures each view's size, what the overview's
//! live feed carries a minute while services are scaled every two
//! seconds, and what the tab costs then: its renderer's resident memory
//! and JavaScript heap.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::runtime::Handle;

use crate::browser::{Browser, BrowserError, Tab};
use crate::cluster::Cluster;
use crate::error::BenchError;
use crate::scenario::{Outcome, Progress};
use crate::stats::Summary;
use crate::workload::Workload;

/// Live updates timed on a service's page.
const UPDATES: usize = 10;
/// The quiet before each timed update (a feed sends at most once a
/// second).
const QUIET: Duration = Duration::from_millis(1_500);
/// How long the overview stays open while services are scaled.
const CHURN: Duration = Duration::from_secs(60);
/// How often a service is scaled meanwhile.
const CHURN_EVERY: Duration = Duration::from_secs(2);
/// How long a page may take to show what it waits for.
const PAGE_WAIT: Duration = Duration::from_secs(120);

/// What the console scenario measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConsoleFigures {
    /// Milliseconds from navigating to a page to its first view drawn,
    /// by page.
    pub first_view_ms: BTreeMap<String, f64>,
    /// Bytes of each page's view (JSON) as the live feed sent it.
    pub view_bytes: BTreeMap<String, u64>,
    /// Seconds from a scale's answer to the service's page showing it,
    /// each after a quiet spell (within a burst a feed sends at most one
    /// message a second).
    pub update_seconds: Summary,
    /// Characters the overview's live feed carried a minute while a
    /// service was scaled every two seconds.
    pub feed_bytes_per_minute: f64,
    /// The console tab's renderer after it: its private memory (what
    /// closing the tab frees), its proportional share of shared pages
    /// (PSS), and its JavaScript heap.
    pub tab_private_mib: f64,
    pub tab_pss_mib: f64,
    pub js_heap_mib: f64,
    /// The private memory of an empty tab's renderer in the same browser,
    /// measured the same way: the floor the console's figure stands on.
    pub blank_tab_private_mib: f64,
}

impl From<BrowserError> for BenchError {
    fn from(error: BrowserError) -> Self {
        BenchError::Task {
            what: "browser".into(),
            problem: error.to_string(),
        }
    }
}

/// Drives the console against `cluster`, deployed with `workload`.
pub(crate) async fn console(
    cluster: &mut Cluster,
    workload: &Workload,
    deployed: Outcome,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    progress.phase("the console in headless Chromium", 0);
    let client = cluster.client().clone();
    let node = cluster.node_names().into_iter().next().unwrap_or_default();
    let services = workload.replicas.clone();
    let handle = Handle::current();
    let figures = tokio::task::spawn_blocking(move || {
        let mut figures = ConsoleFigures::default();
        let mut session = Session::open(client.base_url())?;
        session.first_views(&services, &node, &mut figures)?;
        figures.update_seconds = session.live_updates(&handle, &client, &services)?;
        session.churn(&handle, &client, &services, &mut figures)?;
        session.close(&mut figures)?;
        Ok::<_, BenchError>(figures)
    })
    .await
    .map_err(|error| BenchError::Task {
        what: "console".into(),
        problem: error.to_string(),
    })??;
    Ok(Outcome {
        console: Some(figures),
        ..deployed
    })
}

/// One tab on the console.
struct Session {
    browser: Browser,
    tab: Tab,
}

impl Session {
    fn open(base: &str) -> Result<Self, BenchError> {
        let mut browser = Browser::launch(1280, 900)?;
        let tab = browser.open(&format!("{base}/ui"))?;
        browser.wait_for(
            &tab,
            "window.ccaConsole && window.ccaConsole.drawnAt > 0",
            PAGE_WAIT,
        )?;
        Ok(Session { browser, tab })
    }

    fn eval(&mut self, expression: &str) -> Result<serde_json::Value, BenchError> {
        Ok(self.browser.eval(&self.tab, expression)?)
    }

    /// Navigates to `hash` and returns the milliseconds to its first view
    /// and that view's size.
    fn visit(&mut self, hash: &str) -> Result<(f64, u64), BenchError> {
        let hash = serde_json::to_string(hash).unwrap_or_default();
        let started = self.eval(&format!(
            "(() => {{ const t = performance.now(); location.hash = {hash}; return t; }})()"
        ))?;
        let started = started.as_f64().unwrap_or(0.0);
        self.browser.wait_for(
            &self.tab,
            &format!("window.ccaConsole.drawnAt > {started} && window.ccaConsole.page === {hash}"),
            PAGE_WAIT,
        )?;
        let drawn = self.eval("[window.ccaConsole.drawnAt, window.ccaConsole.lastBytes]")?;
        Ok((
            drawn[0].as_f64().unwrap_or(0.0) - started,
            drawn[1].as_u64().unwrap_or(0),
        ))
    }

    fn first_views(
        &mut self,
        services: &[(String, u32)],
        node: &str,
        figures: &mut ConsoleFigures,
    ) -> Result<(), BenchError> {
        let biggest = services
            .iter()
            .max_by_key(|(_, replicas)| *replicas)
            .map(|(name, _)| name.clone())
            .unwrap_or_default();
        // A first visit warms the page up (its code compiled, its feed
        // opened once): each page is measured after it.
        self.visit("#/services")?;
        let pages = [
            ("overview", "#/".to_owned()),
            ("services", "#/services".to_owned()),
            ("services, page 10", "#/services?page=9".to_owned()),
            ("service (most instances)", format!("#/services/{biggest}")),
            ("nodes", "#/nodes".to_owned()),
            ("node", format!("#/nodes/{node}")),
            ("events", "#/events".to_owned()),
        ];
        for (name, hash) in &pages {
            let (ms, bytes) = self.visit(hash)?;
            figures.first_view_ms.insert((*name).to_owned(), ms);
            figures.view_bytes.insert((*name).to_owned(), bytes);
        }
        Ok(())
    }

    /// Scales a service up and down [`UPDATES`] times with its page open,
    /// each after [`QUIET`]; each time, from the API's answer to the page
    /// showing the count.
    fn live_updates(
        &mut self,
        handle: &Handle,
        client: &cca_wire::Client,
        services: &[(String, u32)],
    ) -> Result<Summary, BenchError> {
        let Some((service, replicas)) = services.first().cloned() else {
            return Ok(Summary::default());
        };
        self.visit(&format!("#/services/{service}"))?;
        let mut took = Vec::with_capacity(UPDATES);
        for round in 0..UPDATES {
            // After a quiet spell longer than a feed's spacing: the time a
            // change takes to show, not the spacing of a burst.
            std::thread::sleep(QUIET);
            let wanted = if round % 2 == 0 {
                replicas + 1
            } else {
                replicas
            };
            handle.block_on(client.scale(&service, wanted))?;
            let answered = Instant::now();
            self.browser.wait_for_every(
                &self.tab,
                &format!("document.getElementById('wanted')?.textContent === '{wanted}'"),
                PAGE_WAIT,
                Duration::from_millis(10),
            )?;
            took.push(answered.elapsed());
        }
        Ok(Summary::of(took))
    }

    /// Keeps the overview open for [`CHURN`] while a service is scaled
    /// every [`CHURN_EVERY`]; then reads what the feed carried and what
    /// the tab costs.
    fn churn(
        &mut self,
        handle: &Handle,
        client: &cca_wire::Client,
        services: &[(String, u32)],
        figures: &mut ConsoleFigures,
    ) -> Result<(), BenchError> {
        self.visit("#/")?;
        let before = self
            .eval("window.ccaConsole.received")?
            .as_f64()
            .unwrap_or(0.0);
        let started = Instant::now();
        let mut rng = fastrand::Rng::with_seed(7);
        while started.elapsed() < CHURN {
            if let Some((service, replicas)) = services.get(rng.usize(..services.len().max(1))) {
                let wanted = replicas + rng.u32(0..=1);
                handle.block_on(client.scale(service, wanted))?;
            }
            std::thread::sleep(CHURN_EVERY);
        }
        let after = self
            .eval("window.ccaConsole.received")?
            .as_f64()
            .unwrap_or(0.0);
        figures.feed_bytes_per_minute = (after - before) * 60.0 / started.elapsed().as_secs_f64();
        figures.js_heap_mib = mib(self.browser.js_heap(&self.tab)?);
        Ok(())
    }

    /// Closes the console's tab and an empty tab opened beside it, each
    /// measured as its renderer goes: the console's cost, and its floor.
    fn close(mut self, figures: &mut ConsoleFigures) -> Result<(), BenchError> {
        let blank = self.browser.open("about:blank")?;
        self.browser
            .wait_for(&blank, "document.readyState === 'complete'", PAGE_WAIT)?;
        let console = self
            .browser
            .close_measuring(self.tab.clone(), RENDERER_EXIT)?;
        let console = console.ok_or_else(|| BenchError::Task {
            what: "console".into(),
            problem: "closing the console's tab ended no renderer: its memory is not its own"
                .into(),
        })?;
        figures.tab_private_mib = mib(console.private);
        figures.tab_pss_mib = mib(console.proportional);
        let empty = self.browser.close_measuring(blank, RENDERER_EXIT)?;
        figures.blank_tab_private_mib = empty.map_or(0.0, |empty| mib(empty.private));
        Ok(())
    }
}

/// How long a closed tab's renderer may take to exit.
const RENDERER_EXIT: Duration = Duration::from_secs(10);

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}
