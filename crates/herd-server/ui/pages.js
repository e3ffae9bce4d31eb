// What each dashboard page shows, rendered from the reflectors of app.js:
// each page names the kinds it follows and renders them as HTML (every
// value escaped). Actions are buttons with data-action and data-target,
// handled in app.js; a viewer sees no action buttons.
"use strict";

/// "5s", "35s", "3m", "2h", "4d": how long ago `timestamp` was. Seconds
/// go in steps of five: a page of a thousand nodes whose heartbeat ages
/// changed every second would be redrawn every second, to say nothing
/// an operator acts on.
function age(timestamp) {
  if (!timestamp) return "-";
  const seconds = Math.max(0, Math.floor((Date.now() - Date.parse(timestamp)) / 1000));
  if (seconds < 5) return "<5s";
  if (seconds < 120) return `${seconds - (seconds % 5)}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

function pill(text, tone = "") {
  return `<span class="pill ${tone}">${esc(text)}</span>`;
}

/// A table of `rows` (arrays of HTML cells), or `empty` when there is none.
function table(id, headers, rows, empty) {
  if (!rows.length) return `<p class="muted" id="${id}">${esc(empty)}</p>`;
  const head = headers.map((h) => `<th>${esc(h)}</th>`).join("");
  const body = rows.map((cells) => `<tr>${cells.map((c) => `<td>${c}</td>`).join("")}</tr>`).join("");
  return `<table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

/// One collator for every sort: `localeCompare` with options makes one per
/// call, which a thousand nodes' sort pays ten thousand times a render.
const names = new Intl.Collator(undefined, { numeric: true });

function byName(a, b) {
  return names.compare(a.metadata.name, b.metadata.name);
}

function action(name, target, label, danger = false) {
  if (isViewer()) return "";
  return `<button data-action="${name}" data-target="${esc(target)}"${danger ? ' class="danger"' : ""}>${esc(label)}</button>`;
}

/// What a page shows until every kind it follows is listed: the page
/// then appears whole, once.
function loading(plurals) {
  const waiting = plurals.filter((plural) => !listed(plural));
  return waiting.length ? `<p class="muted">Loading ${esc(waiting.join(", "))}…</p>` : null;
}

function stateTone(state) {
  if (["configured", "Succeeded", "COMPLETED", "RECONCILED"].includes(state)) return "ok";
  if (["configError", "Failed", "Cancelled", "FAILED", "TIMED_OUT", "RECONCILE_FAILED", "RECONCILE_SKIPPED", "ABANDONED"].includes(state)) {
    return "bad";
  }
  return "warn";
}

/// Fetched again when `fingerprint` changes: the leader's view and the
/// verify findings are made of objects the page follows.
const fingerprints = {};
function refetchOn(key, path, fingerprint) {
  if (fingerprints[key] === fingerprint) return;
  fingerprints[key] = fingerprint;
  refetch(key, path);
}

function nodeRole(node) {
  const roles = [node.spec.role || "regular"];
  if (node.status && node.status.master) roles.push("master");
  return roles;
}

/// CPU as the API writes it (`2`, `1500m`), in millicores.
function millicores(text) {
  if (text === undefined || text === null) return 0;
  const t = String(text);
  return t.endsWith("m") ? Number(t.slice(0, -1)) : Number(t) * 1000;
}

const BINARY = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };

/// Bytes as the API writes them (`512Mi`, `1048576`).
function bytes(text) {
  if (text === undefined || text === null) return 0;
  const t = String(text);
  const unit = BINARY[t.slice(-2)];
  return unit ? Number(t.slice(0, -2)) * unit : Number(t);
}

/// Bytes for people, in the largest binary unit reached (`1.5Gi`).
function showBytes(n) {
  const units = Object.entries(BINARY).reverse();
  const [unit, size] = units.find(([, size]) => n >= size) || ["", 1];
  const value = n / size;
  return `${Number.isInteger(value) ? value : value.toFixed(1)}${unit}`;
}

/// What a node's running members use (as its agent last said), against
/// what it has for members: `650m of 1900m`, `1.2Gi of 7.5Gi`.
function nodeUsage(node) {
  const status = node.status || {};
  let cpu = 0;
  let memory = 0;
  for (const report of status.members || []) {
    if (!report.running || !report.usage) continue;
    cpu += millicores(report.usage.cpu);
    memory += bytes(report.usage.memory);
  }
  const of = status.allocatable;
  return {
    cpu: `${cpu}m${of ? ` of ${millicores(of.cpu)}m` : ""}`,
    memory: `${showBytes(memory)}${of ? ` of ${showBytes(bytes(of.memory))}` : ""}`,
  };
}

/// The most node rows the overview shows: past it, the filter narrows.
const NODE_ROWS = 50;

/// What the overview's node filter asks for (kept across renders).
herd.nodeFilter = { text: "", show: "all" };

const NODE_SHOWS = { all: "all nodes", NotReady: "NotReady", Ready: "Ready", candidate: "candidates", drained: "drained", offline: "offline" };

function nodeReady(node) {
  return Boolean(node.status && node.status.ready);
}

/// Whether `node` is one the filter asks for.
function nodeShown(node, filter) {
  const role = nodeRole(node);
  const show =
    filter.show === "all" ||
    (filter.show === "NotReady" && !nodeReady(node)) ||
    (filter.show === "Ready" && nodeReady(node)) ||
    role.includes(filter.show);
  if (!show) return false;
  const text = filter.text.trim().toLowerCase();
  if (!text) return true;
  const said = [node.metadata.name, (node.status || {}).address || "", ...role].join(" ").toLowerCase();
  return said.includes(text);
}

/// NotReady first (what needs the operator), then by name.
function byReadiness(a, b) {
  return nodeReady(a) - nodeReady(b) || byName(a, b);
}

/// Each node's members: the Members placed there, and what a Ready node
/// reports running (members started by a Command, not by an app cluster);
/// a NotReady node's report is not current and is not counted.
function membersPerNode(nodes, members) {
  const perNode = new Map();
  const add = (node, member) => {
    if (!perNode.has(node)) perNode.set(node, new Set());
    perNode.get(node).add(member);
  };
  for (const member of members) if (member.spec.node) add(member.spec.node, member.metadata.name);
  for (const node of nodes.filter(nodeReady)) {
    for (const report of node.status.members || []) add(node.metadata.name, report.name);
  }
  return perNode;
}

/// What the verify findings are made of: fetched again only when it changes.
const verifyInput = memo((nodes, config) =>
  JSON.stringify([nodes.map((n) => [n.metadata.name, n.spec, nodeReady(n), (n.status || {}).configSerial, (n.status || {}).master]), config && config.spec.candidatePoolSize]),
);

function overview() {
  const waiting = loading(PAGES.overview.follows);
  if (waiting) return waiting;
  const nodes = objects("nodes");
  const members = objects("members");
  const leases = objects("leases");
  const replicas = objects("replicas").sort(byName);
  const leaseKey = leases.map((l) => `${l.spec.holderIdentity}/${l.spec.leaseTransitions}`).join();
  const replicaKey = replicas.map((r) => `${r.metadata.name}/${(r.status || {}).leading}/${(r.status || {}).stoppedAt}`).join();
  refetchOn("clusterStatus", "/api/v1/cluster/status", `${leaseKey}|${replicaKey}`);
  const config = objects("clusterconfigs")[0];
  refetchOn("verify", "/api/v1/cluster/verify", verifyInput(version("nodes", "clusterconfigs"), nodes, config));

  const status = herd.clusterStatus;
  const leader = status && status.leader;
  const leaderText = leader
    ? `${esc(leader.identity)} <span class="muted">term ${esc(leader.term)}, leading for ${age(leader.since)}</span>`
    : `<span class="bad">no leader</span>`;
  const replicaRows = replicas.map((replica) => {
    const seen = status && status.replicas.find((r) => r.name === replica.metadata.name);
    const state = seen ? seen.state : replica.status && replica.status.leading ? "Leading" : "Standby";
    return [
      esc(replica.metadata.name),
      pill(state, state === "Leading" ? "ok" : state === "Standby" ? "" : "warn"),
      `<span class="mono">${esc(replica.spec.url)}</span>`,
      esc(replica.spec.node || "-"),
      `${age((replica.status || {}).startedAt)}`,
      `${age((replica.status || {}).lastSeen)} ago`,
    ];
  });

  const verify = herd.verify;
  const findings = verify
    ? verify.findings.map((f) => `<li class="${f.severity === "error" ? "bad" : "warn"}">${esc(f.severity)}: ${esc(f.message)}</li>`).join("")
    : "";
  const pool = verify
    ? `<b id="pool">${verify.candidates} of ${verify.wantedCandidates} wanted</b> <span class="muted">pool size ${verify.poolSize}</span>`
    : `<b id="pool">-</b>`;

  const perNode = membersPerNode(nodes, members);
  const ready = nodes.filter(nodeReady).length;
  const filter = herd.nodeFilter;
  const matching = nodes.filter((node) => nodeShown(node, filter)).sort(byReadiness);
  const nodeRows = matching.slice(0, NODE_ROWS).map((node) => {
    const name = node.metadata.name;
    const role = nodeRole(node);
    const roleText = role.map((r) => pill(r, r === "offline" ? "bad" : r === "drained" ? "warn" : "")).join("");
    const capable = node.spec.masterCapable === false ? ' <span class="muted">(not master capable)</span>' : "";
    // The master's node is not drained: a failover moves the master first.
    const master = node.status && node.status.master;
    const usage = nodeUsage(node);
    const buttons =
      node.spec.role === "drained"
        ? action("undrain", name, "Undrain")
        : node.spec.role !== "offline" && !master
          ? action("drain", name, "Drain", true)
          : "";
    return [
      `<span class="node-name">${esc(name)}</span>`,
      `<span class="node-status">${nodeReady(node) ? pill("Ready", "ok") : pill("NotReady", "bad")}</span>`,
      roleText + capable,
      `${age((node.status || {}).lastHeartbeat)} ago`,
      `<span class="node-members">${(perNode.get(name) || new Set()).size}</span>`,
      `<span class="node-cpu">${esc(usage.cpu)}</span>`,
      `<span class="node-memory">${esc(usage.memory)}</span>`,
      `<span class="mono">${esc((node.status || {}).address || "-")}</span>`,
      `${esc((node.status || {}).configSerial ?? "-")}`,
      buttons,
    ];
  });
  const shows = Object.entries(NODE_SHOWS).map(([value, label]) => `<option value="${value}">${esc(label)}</option>`).join("");
  const counted =
    matching.length > NODE_ROWS
      ? `showing ${NODE_ROWS} of ${matching.length} (NotReady first): narrow the filter to see the others`
      : `${matching.length} of ${nodes.length}`;
  const empty = nodes.length
    ? "no node matches the filter"
    : "no node has joined: start an agent with `herd agent --server URL --name NODE --join-token TOKEN`";

  return `
    <section><h2>Control plane</h2>
      <div class="summary">
        <div>Leader <b id="leader">${leaderText}</b></div>
        <div>Nodes <b id="ready-nodes">${ready} of ${nodes.length} Ready</b></div>
        <div>Master candidates ${pool}</div>
        <div>Members <b>${members.length}</b></div>
      </div>
      ${table("replicas", ["Replica", "State", "URL", "Node", "Up", "Last seen"], replicaRows, "no replica has registered")}
    </section>
    <section><h2>Cluster verify</h2>
      ${verify && !verify.findings.length ? '<p class="ok" id="findings">No findings.</p>' : `<ul id="findings">${findings}</ul>`}
      ${verify && verify.offline.length ? `<p>Offline, not checked: ${esc(verify.offline.join(", "))}</p>` : ""}
    </section>
    <section><h2>Nodes</h2>
      <p class="filters"><input id="node-filter" type="search" placeholder="name, address or role" autocomplete="off">
        <select id="node-show">${shows}</select> <span class="muted" id="node-count">${esc(counted)}</span></p>
      ${table("nodes", ["Name", "Status", "Role", "Heartbeat", "Members", "CPU", "Memory", "Address", "Config serial", ""], nodeRows, empty)}
    </section>`;
}

function memberInstance(member, reports) {
  const report = reports.get(member.metadata.name);
  const detail = (member.status || {}).stateDetail || {};
  return (report && report.instanceId) || detail.lastConfiguredInstance || detail.configuringInstance || "-";
}

/// What a member uses, as its node last said: `250m / 64Mi`.
function memberUsage(report) {
  const usage = report && report.running && report.usage;
  if (!usage) return "-";
  const cpu = usage.cpu === undefined ? "-" : `${millicores(usage.cpu)}m`;
  const memory = usage.memory === undefined ? "-" : showBytes(bytes(usage.memory));
  return `${cpu} / ${memory}`;
}

function clusters() {
  const waiting = loading(PAGES.clusters.follows);
  if (waiting) return waiting;
  const all = objects("appclusters").sort(byName);
  const members = objects("members").sort(byName);
  // A NotReady node's report is not current: what it said is not shown as now.
  const reports = new Map();
  for (const node of objects("nodes").filter((n) => n.status && n.status.ready)) {
    for (const report of node.status.members || []) reports.set(report.name, report);
  }
  const sections = all.map((cluster) => {
    const name = cluster.metadata.name;
    const status = cluster.status || {};
    const rollup = Object.entries(status.memberStateRollup || {}).filter(([, on]) => on).map(([flag]) => pill(flag, "warn"));
    const current = status.observedGeneration === cluster.metadata.generation;
    const own = members.filter((m) => m.spec.cluster === name);
    const rows = own.map((member) => {
      const m = member.metadata.name;
      const s = member.status || {};
      const detail = s.stateDetail || {};
      const node = member.spec.node;
      const notifies = (detail.pendingNotifyCmds || []).length;
      const logs = node
        ? ["setup", "stdout", "stderr"].map((stream) => `<button data-action="logs" data-target="${esc(`${node}/${m}/${stream}`)}">${stream}</button>`).join(" ")
        : "";
      return [
        `<span class="member-name">${esc(m)}</span>`,
        esc(member.spec.role),
        `<span class="member-state" data-member="${esc(m)}">${pill(s.state || "creating", stateTone(s.state))}${detail.crashLoop ? pill(`crash loop ×${detail.crashLoop.runs}`, "bad") : ""}</span>`,
        `<span class="member-ready" data-member="${esc(m)}">${s.ready ? pill("ready", "ok") : pill("not ready", "warn")}</span>`,
        esc(node || "unplaced"),
        `<span class="mono">${esc(memberInstance(member, reports))}</span>`,
        `<span class="member-usage" data-member="${esc(m)}">${esc(memberUsage(reports.get(m)))}</span>`,
        `<span class="last-known" data-member="${esc(m)}">${esc(detail.lastKnownState || "-")}</span>`,
        notifies ? `${notifies} pending` : "-",
        `<span class="bad member-why" data-member="${esc(m)}">${esc(detail.configErrorDetail || (!s.ready && s.notReadyReason) || s.reason || "")}</span>`,
        logs,
      ];
    });
    return `<section class="cluster" data-cluster="${esc(name)}"><h2>${esc(name)} <span class="muted">app ${esc(cluster.spec.appRef)}</span></h2>
      <p>State <span class="cluster-state" data-cluster="${esc(name)}">${pill(status.state || "creating", stateTone(status.state))}</span>
        ${current ? "" : '<span class="muted">(the latest spec is not yet observed)</span>'} ${rollup.join("")}</p>
      ${table(`members-${esc(name)}`, ["Member", "Role", "State", "Ready", "Node", "Instance", "CPU / memory", "Last known", "Notifies", "Why", "Logs"], rows, "no members yet")}
    </section>`;
  });
  return `${sections.join("") || '<p class="muted">No app clusters: apply one with `herd apply -f examples/apps/etcd/`.</p>'}`;
}

/// A copy's bytes staged of its volume's size, as its agent reports them.
function copyProgress(progress) {
  if (!progress || progress.bytes === undefined) return "-";
  const mib = (bytes) => `${(Number(bytes) / 1048576).toFixed(1)} MiB`;
  const total = progress.totalBytes;
  const bar = total ? `<progress max="${esc(total)}" value="${esc(progress.bytes)}"></progress> ` : "";
  return `${bar}${esc(progress.volume || "")} ${mib(progress.bytes)}${total ? ` of ${mib(total)}` : ""}`;
}

function operationsPage() {
  const waiting = loading(PAGES.operations.follows);
  if (waiting) return waiting;
  const budgets = objects("disruptionbudgets").sort(byName);
  const budgetRows = budgets.map((budget) => {
    const s = budget.status || {};
    const bound = budget.spec.minAvailable !== undefined ? `minAvailable ${budget.spec.minAvailable}` : `maxUnavailable ${budget.spec.maxUnavailable}`;
    const unhealthy = (s.unhealthy || []).map((u) => `${esc(u.name)} <span class="muted">(${esc(u.reason)})</span>`).join(", ");
    return [
      esc(budget.metadata.name),
      `<span class="mono">${esc(budget.spec.selector)}</span>`,
      esc(bound),
      `${esc(s.currentHealthy ?? "-")}/${esc(s.expectedMembers ?? "-")}`,
      `<b class="budget-allowed" data-budget="${esc(budget.metadata.name)}">${esc(s.disruptionsAllowed ?? "-")}</b>`,
      unhealthy || "-",
    ];
  });
  const operations = objects("operations").sort((a, b) => b.metadata.creationTimestamp.localeCompare(a.metadata.creationTimestamp));
  const operationRows = operations.map((operation) => {
    const name = operation.metadata.name;
    const s = operation.status || {};
    const a = operation.spec.action;
    const what = a.type === "Drain" ? `drain node ${a.node}` : `restart ${a.cluster}/${a.role}`;
    const blocker = s.blocker && !finished(operation)
      ? `<span class="blocker ${s.blocker.never ? "bad" : "warn"}" data-operation="${esc(name)}">${esc(s.blocker.message)} <span class="muted">(for ${age(s.blocker.since)}${s.blocker.never ? "; can never clear: change the budget or add members" : ""})</span></span>`
      : "";
    const steps = (s.steps || []).map((step) => `${esc(step.member)}: ${esc(step.state)}`).join(", ");
    return [
      esc(name),
      esc(what),
      `<span class="operation-phase" data-operation="${esc(name)}">${pill(s.phase || "Pending", stateTone(s.phase))}</span>`,
      `<progress max="${s.total || 1}" value="${s.done || 0}"></progress> <span class="operation-progress" data-operation="${esc(name)}">${esc(s.done || 0)}/${esc(s.total || 0)}</span>`,
      blocker || esc(s.message || ""),
      `<span class="muted">${steps}</span>`,
      finished(operation) ? "" : action("cancel", name, "Cancel", true),
    ];
  });
  // Unsettled Commands, and settled ones that did not succeed: what an
  // operator may have to retry or abandon.
  const settledWell = ["COMPLETED", "RECONCILED"];
  const notSettled = ["CREATED", "PROCESSING", "ABANDONING", "TIMED_OUT", "INTERRUPTED", "RECONCILE_RETRY", "RECONCILING", "RECONCILE_FAILED"];
  const mayAbandon = notSettled.filter((state) => state !== "ABANDONING");
  const commands = objects("commands")
    .filter((c) => !settledWell.includes((c.status || {}).stateByManagement || "CREATED"))
    .sort(byName);
  const commandRows = commands.map((command) => {
    const name = command.metadata.name;
    const s = command.status || {};
    const management = s.stateByManagement || "CREATED";
    const buttons =
      (notSettled.includes(management) ? "" : action("retry", name, "Retry")) +
      (mayAbandon.includes(management) ? action("abandon", name, "Abandon", true) : "");
    return [
      esc(name),
      esc(command.spec.node),
      esc(command.spec.action.type),
      `<span class="command-state" data-command="${esc(name)}">${pill(management, stateTone(management))}</span>`,
      esc(s.stateByAgent || "-"),
      `${esc(s.attempts || 0)} / ${esc(s.retryCount || 0)}`,
      copyProgress(s.progress),
      esc(s.reason || ""),
      buttons,
    ];
  });
  return `
    <section><h2>Operations</h2>
      ${table("operations", ["Name", "What", "Phase", "Progress", "Blocker", "Steps", ""], operationRows, "No operations: drain a node from the overview, or `herd node drain NODE`.")}
    </section>
    <section><h2>Disruption budgets</h2>
      ${table("budgets", ["Name", "Selector", "Bound", "Healthy", "Allowed", "Not healthy"], budgetRows, "No disruption budgets.")}
    </section>
    <section><h2>Commands not settled, or settled badly</h2>
      ${table("commands", ["Name", "Node", "Action", "Server's view", "Agent's view", "Attempts / retries", "Progress", "Why", ""], commandRows, "Every Command is settled, and none failed.")}
    </section>`;
}

function eventsPage() {
  const waiting = loading(PAGES.events.follows);
  if (waiting) return waiting;
  const events = objects("events")
    .sort((a, b) => (b.spec.lastTimestamp || "").localeCompare(a.spec.lastTimestamp || ""))
    .slice(0, 300);
  const rows = events.map((event) => {
    const e = event.spec;
    return [
      `${age(e.lastTimestamp)} ago`,
      pill(e.type, e.type === "Warning" ? "warn" : ""),
      esc(e.reason),
      esc(`${e.involvedObject.kind.toLowerCase()}/${e.involvedObject.name}`),
      esc(e.count),
      esc(e.message),
    ];
  });
  return `<section><h2>Events <span class="muted">(newest first, live)</span></h2>
    ${table("events", ["Last seen", "Type", "Reason", "Object", "Count", "Message"], rows, "No events.")}</section>`;
}

/// The value at JSON pointer `path` in `object` (undefined when absent).
function pointer(object, path) {
  let value = object;
  for (const part of path.split("/").slice(1)) {
    if (value === null || value === undefined) return undefined;
    value = value[part.replace(/~1/g, "/").replace(/~0/g, "~")];
  }
  return value === null ? undefined : value;
}

/// The same, as text ("" when absent).
function at(object, path) {
  const value = pointer(object, path);
  if (value === undefined) return "";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

/// What `cell` (a column of a kind's descriptor, served at
/// /api/v1/kinds) shows of `object`: the CLI renders the same cells.
function cellText(cell, object) {
  const count = (path) => at(object, path) || "0";
  const each = (path) => {
    const value = pointer(object, path);
    return Array.isArray(value) ? value : [];
  };
  switch (cell.type) {
    case "text": return at(object, cell.path);
    case "textOr": return at(object, cell.path) || cell.otherwise;
    case "firstOf": return cell.paths.map((p) => at(object, p)).find((t) => t) || "";
    case "count": return count(cell.path);
    case "ratio": return `${count(cell.a)}/${count(cell.b)}`;
    case "pair": return `${at(object, cell.a)}${cell.between}${at(object, cell.b)}`;
    case "seconds": return `${at(object, cell.path)}s`;
    case "age": return age(at(object, cell.path));
    case "yesNo": return at(object, cell.path) === "true" ? "yes" : "no";
    case "each": return each(cell.path).map((item) => at(item, cell.field)).join(",") || "-";
    case "eachPair": return each(cell.path).map((item) => `${at(item, cell.key)}=${at(item, cell.value)}`).join(",");
    case "trueKeys": {
      const flags = Object.entries(pointer(object, cell.path) || {});
      return flags.filter(([, set]) => set === true).map(([key]) => key).join(",") || "-";
    }
    case "labels": return Object.entries(object.metadata.labels || {}).map(([k, v]) => `${k}=${v}`).join(",");
    case "nodeStatus": return `${nodeReady(object) ? "Ready" : "NotReady"}${object.spec.unschedulable ? ",SchedulingDisabled" : ""}`;
    case "nodeRole": return nodeRole(object).join(",");
    case "memberState": {
      const state = at(object, "/status/state") || "createPending";
      const crash = ((object.status || {}).stateDetail || {}).crashLoop;
      return crash ? `${state} (crash loop, ${crash.runs} runs)` : state;
    }
    case "eventObject": return `${at(object, "/spec/involvedObject/kind").toLowerCase()}/${at(object, "/spec/involvedObject/name")}`;
    case "operationAction": {
      const type = at(object, "/spec/action/type");
      const target = type === "Restart" ? `${at(object, "/spec/action/cluster")}/${at(object, "/spec/action/role")}` : at(object, "/spec/action/node");
      return `${type} ${target}`;
    }
    default: return "";
  }
}

/// The kind the objects page shows (`#objects/<plural>`).
function objectsKind() {
  return (location.hash.split("/")[1] || "nodes").toLowerCase();
}

/// Any kind's table, from its descriptor alone: a kind added to herd shows
/// here without a change to this file.
function objectsPage() {
  refetchOn("kinds", "/api/v1/kinds", "once");
  const kinds = herd.kinds;
  if (!kinds) return `<p class="muted">Loading the kinds…</p>`;
  const plural = objectsKind();
  const kind = kinds.find((k) => k.plural === plural) || kinds[0];
  const picker = kinds
    .map((k) => `<a href="#objects/${esc(k.plural)}" class="kind${k.plural === kind.plural ? " active" : ""}" data-kind="${esc(k.plural)}">${esc(k.kind)}</a>`)
    .join(" ");
  const waiting = loading([kind.plural]);
  const columns = kind.columns.filter((c) => !c.wide);
  const rows = waiting ? [] : objects(kind.plural).sort(byName).slice(0, 500).map((o) => columns.map((c) => esc(cellText(c.cell, o))));
  const shown = waiting || table("objects", columns.map((c) => c.header), rows, `No ${kind.kind} objects.`);
  return `<section><h2 id="objects-kind" data-kind="${esc(kind.plural)}">${esc(kind.kind)} objects</h2><nav id="kinds">${picker}</nav>${shown}</section>`;
}

const PAGES = {
  overview: { follows: ["nodes", "members", "replicas", "leases", "clusterconfigs"], render: overview },
  clusters: { follows: ["appclusters", "members", "nodes"], render: clusters },
  operations: { follows: ["operations", "disruptionbudgets", "commands"], render: operationsPage },
  events: { follows: ["events"], render: eventsPage },
  objects: { get follows() { return [objectsKind()]; }, render: objectsPage },
};
