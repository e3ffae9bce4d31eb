// The dashboard's core: the token login, calls to the API, reflectors that
// follow the store through the watch API (list, then watch from the list's
// revision; a lost stream is shown and resumed from the last revision seen,
// or listed again when that revision was compacted), page routing, and the
// operator's actions behind a confirmation. What each page shows is in
// pages.js. No framework and no build step: the server embeds these files.
"use strict";

const herd = {
  token: sessionStorage.getItem("herd.token"),
  reflectors: new Map(),
  page: null,
  clusterStatus: null,
  verify: null,
  // Milliseconds spent rendering since the page loaded: what the
  // dashboard benchmark (bench/src/dashboard.rs) reads of an idle page.
  renderMs: 0,
};

const $ = (id) => document.getElementById(id);

/// Text made safe to put in HTML.
function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/// Calls the API with the token; a herd Status body becomes an ApiError
/// carrying its message.
async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${herd.token}` };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  const text = await response.text();
  const json = (response.headers.get("Content-Type") || "").startsWith("application/json");
  const body = json && text ? JSON.parse(text) : text;
  if (!response.ok) {
    throw new ApiError(response.status, (body && body.message) || `${response.status} ${response.statusText}`);
  }
  return body;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/// One kind's objects, kept up to date through the watch API.
class Reflector {
  constructor(plural) {
    this.plural = plural;
    this.items = new Map();
    this.revision = null;
    this.listed = false;
    this.lost = null;
    this.stopped = false;
    this.abort = null;
    /// Counts the changes seen: what is derived from the objects is made
    /// again only when it moves (`memo`).
    this.version = 0;
  }

  start() {
    this.run();
    return this;
  }

  stop() {
    this.stopped = true;
    if (this.abort) this.abort.abort();
  }

  list() {
    return [...this.items.values()];
  }

  async run() {
    let pause = 500;
    while (!this.stopped) {
      try {
        if (this.revision === null) await this.relist();
        await this.watch();
        if (this.stopped) return;
        this.setLost("the server ended the stream");
      } catch (error) {
        if (this.stopped) return;
        if (error.status === 401) return logout(error.message);
        if (error.status === 410) {
          this.revision = null;
          continue;
        }
        this.setLost(error.message);
      }
      await sleep(pause);
      pause = Math.min(pause * 2, 5000);
    }
  }

  async relist() {
    const list = await api(`/api/v1/${this.plural}`);
    this.items = new Map(list.items.map((object) => [object.metadata.name, object]));
    this.revision = list.metadata.resourceVersion;
    this.listed = true;
    this.version++;
    // A page waits on its first lists: shown at once.
    changed(true);
  }

  async watch() {
    this.abort = new AbortController();
    // Changes come in chunks of up to half a second: a page renders at most
    // once a second, and a browser pays for each chunk it reads.
    const url = `/api/v1/${this.plural}?watch=true&batchMillis=500&resourceVersion=${this.revision}`;
    const response = await fetch(url, {
      headers: { Authorization: `Bearer ${herd.token}` },
      signal: this.abort.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new ApiError(response.status, body.message || response.statusText);
    }
    this.setLost(null);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += value;
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, end).trim();
        buffered = buffered.slice(end + 1);
        if (line) this.apply(JSON.parse(line));
      }
    }
  }

  apply(event) {
    const object = event.object;
    if (event.type === "ERROR") throw new ApiError(object.code, object.message);
    if (event.type === "ADDED" || event.type === "MODIFIED") this.items.set(object.metadata.name, object);
    if (event.type === "DELETED") this.items.delete(object.metadata.name);
    if (object.metadata && object.metadata.resourceVersion) this.revision = object.metadata.resourceVersion;
    if (event.type !== "BOOKMARK") {
      this.version++;
      changed();
    }
  }

  setLost(why) {
    if (this.lost === why) return;
    this.lost = why;
    showConnection();
  }
}

function showConnection() {
  const lost = [...herd.reflectors.values()].filter((r) => r.lost);
  const banner = $("connection");
  banner.hidden = lost.length === 0;
  if (lost.length) {
    banner.textContent = `Connection lost (${lost[0].lost}); reconnecting and resuming from the last change seen…`;
  }
}

/// The objects of a kind the current page follows.
function objects(plural) {
  const reflector = herd.reflectors.get(plural);
  return reflector ? reflector.list() : [];
}

/// Where the reflectors of `plurals` stand: a key that moves when any of
/// them changes.
function version(...plurals) {
  return plurals.map((plural) => (herd.reflectors.get(plural) || { version: -1 }).version).join("/");
}

/// `derive`, remembered: made again only when the key it is called with
/// (the first argument) moves.
function memo(derive) {
  let key = null;
  let value;
  return (at, ...args) => {
    if (at !== key) {
      key = at;
      value = derive(...args);
    }
    return value;
  };
}

function listed(plural) {
  const reflector = herd.reflectors.get(plural);
  return Boolean(reflector && reflector.listed);
}

/// Follows exactly these kinds: new reflectors start, others stop.
function follow(plurals) {
  for (const [plural, reflector] of herd.reflectors) {
    if (!plurals.includes(plural)) {
      reflector.stop();
      herd.reflectors.delete(plural);
    }
  }
  for (const plural of plurals) {
    if (!herd.reflectors.has(plural)) herd.reflectors.set(plural, new Reflector(plural).start());
  }
  showConnection();
}

let renderTimer = null;
let renderedAt = 0;

/// At most this often for what the watch streams bring: a thousand nodes'
/// heartbeats are a hundred changes a second, and one render a second
/// shows them (ages are shown in steps of seconds).
const RENDER_GAP_MS = 1000;

/// Something changed: render once, on a frame at least RENDER_GAP_MS after
/// the last render (`now`: at once, for the operator's own input).
function changed(now = false) {
  if (renderTimer !== null) {
    if (!now) return;
    clearTimeout(renderTimer);
  }
  const wait = now ? 0 : Math.max(0, renderedAt + RENDER_GAP_MS - performance.now());
  renderTimer = setTimeout(() => {
    requestAnimationFrame(() => {
      renderTimer = null;
      renderedAt = performance.now();
      render();
    });
  }, wait);
}

let rendered = "";

function render() {
  if (!herd.page) return;
  const started = performance.now();
  const html = PAGES[herd.page].render();
  if (html !== rendered) {
    const next = document.createElement("template");
    next.innerHTML = html;
    morph($("page"), next.content);
    rendered = html;
  }
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === herd.page);
  }
  herd.renderMs += performance.now() - started;
}

/// Makes the children of `have` those of `want`, changing only what
/// differs: an element that stays (a button being clicked, a row being
/// read) stays the same element, as a page that is redrawn every second
/// must. An element equal to the one wanted is passed over whole (the
/// browser compares natively): walking a thousand-node overview in script
/// was most of its cost at idle.
function morph(have, want) {
  const old = [...have.childNodes];
  const wanted = [...want.childNodes];
  wanted.forEach((next, i) => {
    const current = old[i];
    if (!current) {
      have.appendChild(next.cloneNode(true));
    } else if (current.nodeType !== next.nodeType || current.nodeName !== next.nodeName) {
      have.replaceChild(next.cloneNode(true), current);
    } else if (current.nodeType !== Node.ELEMENT_NODE) {
      if (current.nodeValue !== next.nodeValue) current.nodeValue = next.nodeValue;
    } else if (!current.isEqualNode(next)) {
      for (const attribute of [...current.attributes]) {
        if (!next.hasAttribute(attribute.name)) current.removeAttribute(attribute.name);
      }
      for (const attribute of [...next.attributes]) {
        if (current.getAttribute(attribute.name) !== attribute.value) current.setAttribute(attribute.name, attribute.value);
      }
      if (current.nodeName === "PROGRESS") current.value = next.value;
      morph(current, next);
    }
  });
  for (const extra of old.slice(wanted.length)) have.removeChild(extra);
}

/// Fetches something the watch streams do not carry (the leader's view,
/// the verify findings) when what it is made of changed.
const refetches = new Map();
function refetch(key, path) {
  const entry = refetches.get(key) || { running: false, again: false };
  refetches.set(key, entry);
  if (entry.running) {
    entry.again = true;
    return;
  }
  entry.running = true;
  api(path)
    .then((body) => {
      herd[key] = body;
      changed();
    })
    .catch((error) => flash(`${path}: ${error.message}`, true))
    .finally(() => {
      entry.running = false;
      if (entry.again) {
        entry.again = false;
        refetch(key, path);
      }
    });
}

function showPage() {
  const name = (location.hash || "#overview").slice(1).split("/")[0];
  herd.page = PAGES[name] ? name : "overview";
  follow(PAGES[herd.page].follows);
  render();
}

function isViewer() {
  return (herd.token || "").startsWith("herdview.");
}

function showApp() {
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = isViewer() ? "viewer (read only)" : "admin";
  showPage();
}

function logout(why) {
  sessionStorage.removeItem("herd.token");
  herd.token = null;
  follow([]);
  herd.page = null;
  $("page").innerHTML = "";
  rendered = "";
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login").hidden = false;
  $("login-error").hidden = !why;
  $("login-error").textContent = why ? `Logged out: ${why}` : "";
}

async function login(event) {
  event.preventDefault();
  herd.token = $("token").value.trim();
  try {
    await api("/api/v1/cluster/status");
  } catch (error) {
    herd.token = null;
    $("login-error").hidden = false;
    // A valid token of another kind (a node's, a join token) is not refused
    // but may not read: say which tokens log in.
    $("login-error").textContent =
      error.status === 403
        ? "This token does not open the dashboard (is it a node's?): log in with the admin token or a viewer token (herd token create --viewer)"
        : `The token was refused: ${error.message}`;
    return;
  }
  sessionStorage.setItem("herd.token", herd.token);
  $("token").value = "";
  $("login-error").hidden = true;
  showApp();
}

function flash(message, error = false) {
  const banner = $("flash");
  banner.hidden = false;
  banner.textContent = message;
  banner.classList.toggle("error", error);
}

/// Asks the operator to confirm; resolves true on Confirm.
function confirmAction(text) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

/// The actions, each asked through a button's data-action.
const ACTIONS = {
  async drain(node) {
    if (!(await confirmAction(`Drain node ${node}? No new members go there, and every member it hosts is evicted under the disruption budgets.`))) return;
    const operation = {
      apiVersion: "herd/v1",
      kind: "Operation",
      metadata: { name: `drain-${node}-${Date.now()}` },
      spec: { action: { type: "Drain", node } },
    };
    const created = await api("/api/v1/operations", { method: "POST", body: JSON.stringify(operation) });
    flash(`operation/${created.metadata.name} created: draining node ${node}`);
  },

  async undrain(node) {
    if (!(await confirmAction(`Undrain node ${node}? Drains still running on it are cancelled, and it takes new members again.`))) return;
    const running = await api(`/api/v1/operations?labelSelector=${encodeURIComponent(`herd.io/target=${node}`)}`);
    for (const operation of running.items.filter((o) => !finished(o))) await cancelOperation(operation.metadata.name);
    await api(`/api/v1/nodes/${node}/role`, { method: "POST", body: JSON.stringify({ role: "regular" }) });
    flash(`node/${node} regular: it takes new members again`);
  },

  async cancel(name) {
    if (!(await confirmAction(`Cancel operation ${name}? Nothing more is started; members on their way go on.`))) return;
    await cancelOperation(name);
    flash(`operation/${name}: cancel asked`);
  },

  async retry(name) {
    if (!(await confirmAction(`Retry command ${name}? It is issued again to its node.`))) return;
    await api(`/api/v1/commands/${name}/retry`, { method: "POST" });
    flash(`command/${name} issued again`);
  },

  async abandon(name) {
    if (!(await confirmAction(`Abandon command ${name}? Its agent ends the work.`))) return;
    await api(`/api/v1/commands/${name}/abandon`, { method: "POST" });
    flash(`command/${name} abandoned`);
  },

  async logs(target) {
    const [node, member, stream] = target.split("/");
    $("logs-title").textContent = `${member} on ${node}: ${stream}`;
    $("logs-text").textContent = "loading…";
    $("logs").showModal();
    try {
      const text = await api(`/api/v1/nodes/${node}/members/${member}/logs?stream=${stream}`);
      $("logs-text").textContent = typeof text === "string" && text ? text : "(empty)";
    } catch (error) {
      $("logs-text").textContent = `could not fetch the log: ${error.message}`;
    }
  },
};

function finished(operation) {
  return ["Succeeded", "Failed", "Stopped", "Cancelled"].includes((operation.status || {}).phase);
}

async function cancelOperation(name) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const operation = await api(`/api/v1/operations/${name}`);
    if (finished(operation) || operation.spec.cancel) return;
    operation.spec.cancel = true;
    try {
      await api(`/api/v1/operations/${name}`, { method: "PUT", body: JSON.stringify(operation) });
      return;
    } catch (error) {
      if (error.status !== 409) throw error;
    }
  }
  throw new Error(`operation ${name} kept changing; try again`);
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  try {
    await ACTIONS[button.dataset.action](button.dataset.target);
  } catch (error) {
    flash(error.message, true);
  }
});

/// The overview's node filter: typed or chosen, shown at once.
function filterNodes(event) {
  if (event.target.id === "node-filter") herd.nodeFilter.text = event.target.value;
  else if (event.target.id === "node-show") herd.nodeFilter.show = event.target.value;
  else return;
  changed(true);
}
document.addEventListener("input", filterNodes);
document.addEventListener("change", filterNodes);

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", login);
  $("logout").addEventListener("click", () => logout(null));
  window.addEventListener("hashchange", () => herd.token && showPage());
  // Ages (heartbeats, since when) move on their own: render once a second
  // from what is known, without asking the server.
  setInterval(() => herd.page && changed(), 1000);
  if (herd.token) showApp();
  else logout(null);
});
