// The CCattler web console: one page, routed by the URL's fragment. Each
// page follows its view under /v1/console/ as server-sent events (read
// with fetch, so that a bearer token can go with them) and draws it again
// in place when it changes; the server sends summaries of bounded size,
// never a raw watch. Elements are built with `h` (never from HTML text),
// so names and messages from the cluster are always shown as text.
"use strict";

const TOKEN_KEY = "cca-token";
const main = document.getElementById("main");
const link = document.getElementById("link");
const signout = document.getElementById("signout");

// What tests and operators can read: how many views arrived live, and
// how many characters the live feeds carried.
// `drawnAt` is when the last view was drawn (performance.now()), and
// `lastBytes` that view's size.
window.ccaConsole = { updates: 0, revision: null, page: null, received: 0, drawnAt: 0, lastBytes: 0 };

// ---- elements ------------------------------------------------------------

function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of flat(children)) {
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

function badge(health) {
  return h("span", { class: `badge ${health}`, "data-health": health }, health.replace("_", " "));
}

function verdict(v, what) {
  const reasons = v.reasons.length ? h("ul", {}, v.reasons.map((r) => h("li", {}, r))) : null;
  const words = v.health === "healthy" ? `${what} is healthy` : `${what} is ${v.health}`;
  return h("section", { class: `verdict ${v.health}`, "data-verdict": v.health },
    h("strong", {}, words), reasons);
}

function table(headers, rows, empty) {
  if (!rows.length) return h("p", { class: "note" }, empty);
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
    h("tbody", {}, rows));
}

function fields(pairs) {
  return h("dl", { class: "fields" },
    pairs.filter(([, value]) => value !== null && value !== undefined && value !== "")
      .map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
}

function when(millis) {
  if (!millis) return "";
  return new Date(millis).toLocaleString();
}

function ago(millis) {
  if (!millis) return "";
  const seconds = Math.max(0, Math.round((Date.now() - millis) / 1000));
  if (seconds < 90) return `${seconds}s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)}m ago`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)}h ago`;
  return `${Math.round(seconds / 86400)}d ago`;
}

function subjectLink(subject) {
  const [kind, ...rest] = subject.split("/");
  const name = rest.join("/");
  const pages = { service: "services", node: "nodes", instance: "instances" };
  if (!pages[kind] || !name) return subject;
  return h("a", { href: `#/${pages[kind]}/${encodeURIComponent(name)}` }, subject);
}

function eventsTable(events) {
  const rows = events.slice().reverse().map((record) => {
    const e = record;
    return h("tr", { class: `event ${e.level}` },
      h("td", { title: when(e.at), class: "when" }, ago(e.at)),
      h("td", {}, e.level),
      h("td", {}, e.source),
      h("td", {}, subjectLink(e.subject)),
      h("td", {}, e.message));
  });
  return table(["when", "level", "source", "subject", "message"], rows, "No events.");
}

function pager(page, onPage) {
  if (page.pages <= 1) return null;
  return h("div", { class: "pager" },
    h("button", { type: "button", disabled: page.page === 0, onclick: () => onPage(page.page - 1) }, "‹ previous"),
    h("span", {}, `page ${page.page + 1} of ${page.pages} (${page.total} rows)`),
    h("button", { type: "button", disabled: page.page + 1 >= page.pages, onclick: () => onPage(page.page + 1) }, "next ›"));
}

// ---- the API -------------------------------------------------------------

function headers(extra) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const all = Object.assign({}, extra);
  if (token) all.Authorization = `Bearer ${token}`;
  return all;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body.error) message = body.error;
  } catch (_) { /* not ours: keep the status line */ }
  return new ApiError(response.status, message);
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// Follows `path` live: calls `onView(content, revision)` for each view and
// `onProblem(error)` for each problem (a gone object, a refused call),
// reconnecting with backoff when the stream ends. Returns a stop function.
function follow(path, onView, onProblem) {
  const abort = new AbortController();
  let delay = 500;
  const separator = path.includes("?") ? "&" : "?";
  async function run() {
    while (!abort.signal.aborted) {
      try {
        const response = await fetch(`${path}${separator}live=true`, {
          headers: headers({ Accept: "text/event-stream" }),
          signal: abort.signal,
        });
        if (!response.ok) throw await failure(response);
        setLink("live", "live");
        delay = 500;
        await readEvents(response.body, (name, id, data) => {
          const content = JSON.parse(data);
          if (name === "view") {
            window.ccaConsole.updates += 1;
            window.ccaConsole.lastBytes = data.length;
            window.ccaConsole.revision = Number(id);
            document.body.dataset.revision = id;
            onView(content, Number(id));
          } else if (name === "problem") {
            onProblem(new ApiError(content.status, content.error));
          }
        });
      } catch (error) {
        if (abort.signal.aborted) return;
        if (error instanceof ApiError) {
          onProblem(error);
          if (error.status === 401) return;
          if (error.status === 403 || error.status === 404) return;
        }
      }
      if (abort.signal.aborted) return;
      setLink("down", `reconnecting in ${Math.round(delay / 1000)}s`);
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }
  run();
  return () => abort.abort();
}

// Reads server-sent events from `body`, calling `deliver(name, id, data)`.
async function readEvents(body, deliver) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    window.ccaConsole.received += value.length;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message", id = null, data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("id: ")) id = line.slice(4);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) deliver(name, id, data);
    }
  }
}

function setLink(state, words) {
  link.className = `link ${state}`;
  link.textContent = words;
}

// ---- pages ---------------------------------------------------------------

let stopFollowing = () => {};

// The elements of `children`, however nested, without the empty ones.
function flat(children) {
  return [children].flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);
}

function show(...children) {
  main.replaceChildren(...flat(children));
}

function problemBox(error) {
  return h("div", { class: "error", "data-problem": error.status || "" }, error.message);
}

// A page that follows one view: `draw(content)` returns its elements.
function livePage(path, draw, toolbar) {
  const body = h("div", { class: "live-body" }, h("p", { class: "note" }, "Loading…"));
  show(toolbar || [], body);
  stopFollowing = follow(path,
    (content) => {
      body.replaceChildren(...flat(draw(content)));
      window.ccaConsole.drawnAt = performance.now();
    },
    (error) => {
      if (error.status === 401) return signIn(error.message);
      body.replaceChildren(problemBox(error));
    });
}

function overview() {
  livePage("/v1/console/overview", ({ view, events }) => {
    const n = view.nodes;
    const services = Object.entries(view.services);
    const instances = Object.entries(view.instances);
    const total = (entries) => entries.reduce((sum, [, count]) => sum + count, 0);
    return [
      h("h1", {}, "Cluster"),
      verdict(view.verdict, "The cluster"),
      h("div", { class: "cards" },
        h("div", { class: "card", id: "card-nodes" }, h("h3", {}, "Nodes"),
          h("div", { class: "big" }, `${n.ready}/${n.total}`), h("span", { class: "note" }, "ready"),
          h("dl", {}, ["unreachable", "draining", "disabled"].map((k) => [h("dt", {}, k), h("dd", {}, n[k])]))),
        h("div", { class: "card", id: "card-services" }, h("h3", {}, "Services"),
          h("div", { class: "big" }, total(services)),
          h("dl", {}, services.map(([health, count]) => [h("dt", {}, badge(health)), h("dd", {}, count)]))),
        h("div", { class: "card", id: "card-instances" }, h("h3", {}, "Instances"),
          h("div", { class: "big" }, total(instances)),
          h("dl", {}, instances.map(([state, count]) => [h("dt", {}, state), h("dd", { "data-state": state }, count)])))),
      h("h2", {}, `Problems (${view.problems_total})`),
      table(["health", "what", "why"], view.problems.map((p) => h("tr", {},
        h("td", {}, badge(p.health)), h("td", {}, subjectLink(p.subject)),
        h("td", { class: "reasons" }, p.reasons.join("; ")))), "Nothing is wrong."),
      view.problems_total > view.problems.length
        ? h("p", { class: "note" }, `… and ${view.problems_total - view.problems.length} more: see Services and Nodes.`) : null,
      h("h2", {}, `Unplaced demand (${view.unplaced_services} ${view.unplaced_services === 1 ? "service" : "services"})`),
      table(["service", "waiting", "why", "nearest node", "since"], view.unplaced.map((u) => h("tr", {},
        h("td", {}, subjectLink(`service/${u.service}`)), h("td", { class: "num" }, u.count),
        h("td", {}, `${u.reason.replaceAll("_", " ")}: ${u.constraint}`),
        h("td", {}, u.nearest_node || ""), h("td", {}, ago(u.since)))), "All demand is placed."),
      h("h2", {}, "Recent events"),
      eventsTable(events),
    ];
  });
}

// A list page with a search box and pages.
function listPage(title, path, columns, row) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const query = params.get("q") || "";
  const page = Number(params.get("page") || 0);
  const search = h("input", { type: "search", placeholder: "filter by name", value: query });
  let timer = null;
  search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => go(title.toLowerCase(), search.value, 0), 300);
  });
  const toolbar = [h("h1", {}, title), h("div", { class: "toolbar" }, search)];
  const path_ = `${path}?page=${page}&q=${encodeURIComponent(query)}`;
  livePage(path_, ({ view, events }) => [
    table(columns, view.rows.map(row), query ? `Nothing named like “${query}”.` : "None yet."),
    pager(view, (next) => go(title.toLowerCase(), query, next)),
    h("h2", {}, "Recent events"),
    eventsTable(events),
  ], toolbar);
  setTimeout(() => { if (query) { search.focus(); } }, 0);
}

function go(list, query, page) {
  const q = new URLSearchParams();
  if (query) q.set("q", query);
  if (page) q.set("page", page);
  const tail = q.toString();
  location.hash = `#/${list}${tail ? `?${tail}` : ""}`;
}

function services() {
  listPage("Services", "/v1/console/services", ["service", "health", "ready / wanted", "unplaced", "why"], (s) =>
    h("tr", { "data-service": s.name },
      h("td", {}, h("a", { href: `#/services/${encodeURIComponent(s.name)}` }, s.name)),
      h("td", {}, badge(s.verdict.health)),
      h("td", { class: "num" }, `${s.running} / ${s.replicas}`),
      h("td", { class: "num" }, s.unplaced || ""),
      h("td", { class: "reasons" }, s.verdict.reasons.join("; "))));
}

function nodes() {
  listPage("Nodes", "/v1/console/nodes", ["node", "health", "instances", "cpu", "memory", "why"], (n) =>
    h("tr", { "data-node": n.name },
      h("td", {}, h("a", { href: `#/nodes/${encodeURIComponent(n.name)}` }, n.name)),
      h("td", {}, badge(n.verdict.health)),
      h("td", { class: "num" }, n.instances),
      h("td", { class: "num" }, `${n.cpu_allocated} / ${n.cpu}`),
      h("td", { class: "num" }, `${n.memory_allocated} / ${n.memory}`),
      h("td", { class: "reasons" }, n.verdict.reasons.join("; "))));
}

function instanceRows(page, onPage) {
  return [
    table(["instance", "health", "state", "node", "restarts", "address", "why"], page.rows.map((i) =>
      h("tr", { "data-instance": i.id, "data-state": i.state },
        h("td", {}, h("a", { href: `#/instances/${encodeURIComponent(i.id)}` }, i.id)),
        h("td", {}, badge(i.verdict.health)),
        h("td", {}, i.state),
        h("td", {}, h("a", { href: `#/nodes/${encodeURIComponent(i.node)}` }, i.node)),
        h("td", { class: "num" }, i.restarts),
        h("td", {}, i.address || ""),
        h("td", { class: "reasons" }, i.verdict.reasons.join("; ")))), "No instances."),
    pager(page, onPage),
  ];
}

function json(value) {
  return h("details", {}, h("summary", {}, "Specification"), h("pre", {}, JSON.stringify(value, null, 2)));
}

function servicePage(name, page) {
  const here = `#/services/${encodeURIComponent(name)}`;
  livePage(`/v1/console/services/${encodeURIComponent(name)}?page=${page}`, ({ view, events }) => {
    const s = view.summary;
    const rollout = view.rollout;
    return [
      h("h1", {}, `Service ${name}`, badge(view.row.verdict.health)),
      verdict(view.row.verdict, `Service ${name}`),
      fields([
        ["workload", s.workload],
        ["ready / wanted", [h("span", { id: "ready" }, view.row.running), " / ", h("span", { id: "wanted" }, view.row.replicas)]],
        ["instances", s.instances],
        ["virtual IP", s.vip && s.vip.address ? s.vip.address : null],
        ["DNS", s.dns],
        ["ready backends", Object.entries(view.endpoints).map(([port, n]) => `${port}: ${n}`).join(", ")],
        ["rollout", rollout && rollout.rollout ? `${rollout.rollout.phase} to ${rollout.placing.slice(0, 12)}${rollout.paused ? " (paused)" : ""}` : null],
        ["waiting for", rollout && rollout.waiting.length ? rollout.waiting.join("; ") : null],
        ["created", when(s.created_at)],
      ]),
      h("h2", {}, "Instances"),
      instanceRows(view.instances, (next) => { location.hash = `${here}?page=${next}`; }),
      h("h2", {}, "Events"),
      eventsTable(events),
      h("h2", {}, "Logs"),
      h("p", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); logTail(`/v1/services/${encodeURIComponent(name)}/logs`, e.target); } }, "Tail the logs of every instance")),
      json(view.spec),
    ];
  });
}

function nodePage(name, page) {
  const here = `#/nodes/${encodeURIComponent(name)}`;
  livePage(`/v1/console/nodes/${encodeURIComponent(name)}?page=${page}`, ({ view, events }) => {
    const n = view.row;
    const usage = view.usage;
    return [
      h("h1", {}, `Node ${name}`, badge(n.verdict.health)),
      verdict(n.verdict, `Node ${name}`),
      fields([
        ["status", n.status],
        ["cpu allocated", `${n.cpu_allocated} of ${n.cpu}`],
        ["memory allocated", `${n.memory_allocated} of ${n.memory}`],
        ["used", usage ? JSON.stringify(usage) : null],
        ["instances", n.instances],
        ["addresses", n.addresses.join(", ")],
        ["arch", n.arch], ["zone", n.zone],
        ["labels", Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(", ")],
        ["drain held by", view.drain_held_by.join(", ")],
        ["registered", when(n.registered_at)],
      ]),
      h("h2", {}, "Instances"),
      instanceRows(view.instances, (next) => { location.hash = `${here}?page=${next}`; }),
      h("h2", {}, "Events"),
      eventsTable(events),
    ];
  });
}

function instancePage(id) {
  const logs = h("pre", { class: "logs", id: "logs" }, "");
  const logLink = h("a", { href: "#", onclick: (e) => { e.preventDefault(); logTail(`/v1/instances/${encodeURIComponent(id)}/logs`, e.target, logs); } }, "Follow its logs");
  livePage(`/v1/console/instances/${encodeURIComponent(id)}`, ({ view, events }) => {
    const i = view.row;
    const status = view.status || {};
    const exit = status.last_exit;
    return [
      h("h1", {}, `Instance ${id}`, badge(i.verdict.health)),
      verdict(i.verdict, `Instance ${id}`),
      fields([
        ["service", h("a", { href: `#/services/${encodeURIComponent(i.service)}` }, i.service)],
        ["node", h("a", { href: `#/nodes/${encodeURIComponent(i.node)}` }, i.node)],
        ["state", h("span", { id: "instance-state" }, i.state)],
        ["health check", i.healthy === null ? "none yet" : (i.healthy ? "passing" : "failing")],
        ["restarts", h("span", { id: "instance-restarts" }, i.restarts)],
        ["pid", status.pid],
        ["address", i.address],
        ["message", status.message],
        ["last exit", exit ? `${exit.reason}${exit.code !== null ? ` with code ${exit.code}` : ""}${exit.signal !== null ? ` by signal ${exit.signal}` : ""}, ${ago(exit.at)}` : null],
        ["created", when(i.created_at)],
      ]),
      exit && exit.log_tail.length ? [h("h2", {}, "Its last lines before it ended"), h("pre", {}, exit.log_tail.join("\n"))] : null,
      h("h2", {}, "Logs"),
      h("p", {}, logLink),
      logs,
      h("h2", {}, "Events"),
      eventsTable(events),
    ];
  });
  // The log tail lives outside the redrawn view, so it keeps its lines.
  logTail(`/v1/instances/${encodeURIComponent(id)}/logs`, logLink, logs);
}

// Follows a log stream into `into` (a new <pre> after `anchor` if none),
// keeping its last 1,000 lines; when the stream ends (the instance exited)
// it follows again from the next line on, until the page changes.
let stopLogs = () => {};
function logTail(path, anchor, into) {
  stopLogs();
  const out = into || h("pre", { class: "logs" }, "");
  if (!into) anchor.after(out);
  const abort = new AbortController();
  stopLogs = () => abort.abort();
  const lines = [];
  const draw = (extra) => {
    if (lines.length > 1000) lines.splice(0, lines.length - 1000);
    out.textContent = lines.concat(extra || []).join("\n");
    out.scrollTop = out.scrollHeight;
  };
  (async () => {
    let tail = 200;
    while (!abort.signal.aborted) {
      try {
        const response = await fetch(`${path}?tail=${tail}&follow=true`, { headers: headers({}), signal: abort.signal });
        if (!response.ok) throw await failure(response);
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let partial = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          partial += value;
          const parts = partial.split("\n");
          partial = parts.pop();
          lines.push(...parts);
          draw();
        }
        draw(["— the stream ended (the instance exited); following again —"]);
      } catch (error) {
        if (abort.signal.aborted) return;
        draw([`— logs unavailable: ${error.message}; trying again —`]);
      }
      tail = 0;
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  })();
}

function eventsPage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const query = params.get("q") || "";
  const search = h("input", { type: "search", placeholder: "subject starts with (service/web)", value: query });
  search.addEventListener("change", () => { location.hash = `#/events${search.value ? `?q=${encodeURIComponent(search.value)}` : ""}`; });
  livePage(`/v1/console/events?q=${encodeURIComponent(query)}`, ({ events }) => eventsTable(events),
    [h("h1", {}, "Events"), h("div", { class: "toolbar" }, search)]);
}

function diffPage() {
  const source = h("textarea", { id: "program", spellcheck: "false", placeholder: "Paste a .cca program here" });
  const prune = h("input", { type: "checkbox", id: "prune" });
  const result = h("div", { id: "diff-result" });
  const applyButton = h("button", { type: "button", id: "apply", disabled: true }, "Apply");
  let diffed = null;
  source.addEventListener("input", () => { applyButton.disabled = source.value !== diffed; });
  async function run(path, applying) {
    result.replaceChildren(h("p", { class: "note" }, applying ? "Applying…" : "Comparing…"));
    try {
      const report = await post(path, { source: source.value, prune: prune.checked });
      result.replaceChildren(reportView(report));
      diffed = applying ? null : source.value;
      applyButton.disabled = applying || (report.created.length + report.changed.length + report.deleted.length === 0);
    } catch (error) {
      if (error.status === 401) return signIn(error.message);
      result.replaceChildren(problemBox(error));
      applyButton.disabled = true;
    }
  }
  applyButton.addEventListener("click", () => run("/v1/console/apply", true));
  show(
    h("h1", {}, "Diff before apply"),
    h("p", { class: "note" }, "What applying the program would change, compiled and planned by the server as `cca apply --dry-run` would. Apply is offered once the diff shows changes to this very text."),
    source,
    h("div", { class: "toolbar" },
      h("button", { type: "button", id: "diff", onclick: () => run("/v1/console/diff", false) }, "Show the diff"),
      h("label", {}, prune, " also delete the services it omits (prune)"),
      applyButton),
    result);
  setLink("", "");
}

function reportView(report) {
  const list = (names, kind) => names.map((name) => h("li", { class: `diff-${kind}` }, `${kind} ${name}`));
  const empty = report.created.length + report.changed.length + report.deleted.length === 0;
  return h("section", { class: "report", "data-dry-run": String(report.dry_run) },
    h("h2", {}, report.dry_run ? "Would change" : `Applied at revision ${report.revision}`),
    empty ? h("p", {}, `Nothing to change: ${report.unchanged} facts already as asked.`)
      : h("ul", {}, list(report.created, "created"), list(report.changed, "changed"), list(report.deleted, "deleted")),
    empty ? null : h("p", { class: "note" }, `${report.unchanged} facts unchanged.`));
}

function signIn(message) {
  stopFollowing();
  const token = h("input", { type: "password", id: "token", autocomplete: "off", placeholder: "paste a token" });
  show(h("h1", {}, "Sign in"),
    h("form", { class: "signin", onsubmit: (e) => {
      e.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, token.value.trim());
      route();
    } },
      h("p", {}, message || "This cluster asks who you are."),
      h("p", { class: "note" }, "Paste a user token: `cca login` prints one, or an administrator's `cca user token NAME`. It is kept in this tab only."),
      token,
      h("button", { type: "submit" }, "Sign in")));
  setLink("down", "signed out");
}

signout.addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  route();
});

// ---- routing -------------------------------------------------------------

function route() {
  stopFollowing();
  stopLogs();
  stopFollowing = () => {};
  signout.hidden = !sessionStorage.getItem(TOKEN_KEY);
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const page = Number(new URLSearchParams(search || "").get("page") || 0);
  const section = parts[0] || "overview";
  window.ccaConsole.page = location.hash || "#/";
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("current", a.dataset.nav === section || (section === "instances" && a.dataset.nav === "services"));
  }
  if (section === "overview") return overview();
  if (section === "services") return parts[1] ? servicePage(parts[1], page) : services();
  if (section === "nodes") return parts[1] ? nodePage(parts[1], page) : nodes();
  if (section === "instances" && parts[1]) return instancePage(parts[1]);
  if (section === "events") return eventsPage();
  if (section === "diff") return diffPage();
  show(problemBox(new ApiError(404, `The console has no page ${location.hash}.`)));
}

// A link that signs in (`cca dev` prints one) holds a token in its
// fragment: kept in this tab, then taken out of the address bar.
function takeToken() {
  const match = location.hash.match(/^#token=([^&]+)$/);
  if (!match) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
  history.replaceState(null, "", `${location.pathname}#/`);
}

window.addEventListener("hashchange", route);
takeToken();
route();
