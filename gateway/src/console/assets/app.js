// Tessera's console: hash-routed pages over the JSON API of /api/v1.
// No framework and no build step: this file is served from the binary.
"use strict";

const main = document.getElementById("main");
let session = null;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

function bytes(n) {
  if (n == null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

async function api(path) {
  const response = await fetch("/api/v1/" + path, { credentials: "same-origin" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// Writes: JSON POSTs with the session's CSRF token.
async function post(path, body) {
  const response = await fetch("/api/v1/" + path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Tessera-CSRF": session.csrf_token },
    body: JSON.stringify(body ?? {}),
  });
  const answer = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

const writable = () => session && !session.read_only;

// Runs a form's write; shows its error beside the form, or reloads the page.
function onSubmit(id, action) {
  const form = document.getElementById(id);
  if (!form) return;
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const status = form.querySelector(".status");
    try {
      status.textContent = "…";
      await action(new FormData(form));
      status.textContent = "";
      route();
    } catch (err) {
      status.textContent = err.message;
      status.className = "status bad";
    }
  });
}

function configsOf(text) {
  const configs = {};
  for (const pair of (text || "").split(",").map((p) => p.trim()).filter(Boolean)) {
    const [k, ...v] = pair.split("=");
    configs[k.trim()] = v.join("=").trim();
  }
  return configs;
}

function table(headers, rows) {
  const head = headers.map((h) => `<th class="${h.num ? "num" : ""}">${esc(h.label ?? h)}</th>`).join("");
  const body = rows.map((r) => "<tr>" + r.map((cell, i) =>
    `<td class="${headers[i].num ? "num" : ""}">${cell}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body ||
    `<tr><td colspan="${headers.length}" class="muted">none</td></tr>`}</tbody></table>`;
}

function card(label, value, cls = "") {
  return `<div class="card"><div class="v ${cls}">${esc(value)}</div><div class="k">${esc(label)}</div></div>`;
}

const num = (label) => ({ label, num: true });

async function clusterPage() {
  const c = await api("cluster");
  const brokers = c.brokers.map((b) => [
    esc(b.id) + (b.controller ? ' <span class="tag">controller</span>' : "") +
      (b.id === c.node_id ? ' <span class="tag">this node</span>' : ""),
    b.voter ? "broker, controller" : "broker",
    esc(b.host + ":" + b.port),
    esc(b.rack ?? ""),
    b.fenced ? '<span class="bad">fenced</span>' : '<span class="ok">live</span>',
    esc(b.leader_partitions), esc(b.replicas), esc(bytes(b.bytes_in_per_sec) + "/s"),
  ]);
  main.innerHTML = `<h1>Cluster <span class="muted">${esc(c.cluster_id)}</span></h1>
    <div class="cards">
      ${card("brokers", c.brokers.length)}
      ${card("topics", c.topics)}
      ${card("partitions", c.partitions)}
      ${card("ranges", c.ranges)}
      ${card("under-replicated", c.under_replicated_partitions, c.under_replicated_partitions ? "bad" : "")}
      ${card("offline", c.offline_partitions, c.offline_partitions ? "bad" : "")}
      ${card("version", c.version)}
    </div>
    <h2>Brokers</h2>
    ${table(["id", "roles", "address", "rack", "state", num("leads partitions"), num("active segments"), num("bytes in")], brokers)}`;
}

async function topicsPage(params) {
  const search = params.get("search") ?? "";
  const topics = await api("topics?search=" + encodeURIComponent(search));
  const rows = topics.map((t) => [
    `<a href="#/topics/${encodeURIComponent(t.name)}">${esc(t.name)}</a>` +
      (t.internal ? ' <span class="tag">internal</span>' : ""),
    esc(t.partitions), esc(t.replication_factor), esc(t.ranges),
    esc(bytes(t.sealed_bytes)), esc(bytes(t.bytes_in_per_sec) + "/s"),
  ]);
  main.innerHTML = `<h1>Topics</h1>
    <div class="toolbar"><input id="search" placeholder="search topics" value="${esc(search)}"></div>
    ${table(["name", num("partitions"), num("replication"), num("ranges"), num("sealed size"), num("bytes in")], rows)}
    ${writable() ? `<h2>Create a topic</h2>
    <form class="toolbar" id="create-topic">
      <input name="name" placeholder="name" required>
      <input name="partitions" type="number" min="1" placeholder="partitions (default)">
      <input name="replication_factor" type="number" min="1" placeholder="replication (default)">
      <input name="configs" placeholder="configs: key=value, ...">
      <button>Create</button><span class="status"></span>
    </form>` : ""}`;
  onSubmit("create-topic", (f) => post("topics", {
    name: f.get("name"),
    partitions: f.get("partitions") ? Number(f.get("partitions")) : null,
    replication_factor: f.get("replication_factor") ? Number(f.get("replication_factor")) : null,
    configs: configsOf(f.get("configs")),
  }));
  const input = document.getElementById("search");
  input.addEventListener("change", () => {
    location.hash = "#/topics?search=" + encodeURIComponent(input.value);
  });
}

async function topicPage(name) {
  const t = await api("topics/" + encodeURIComponent(name));
  const partitions = t.partitions.map((p) => [
    esc(p.partition),
    p.leader >= 0 ? esc(p.leader) : '<span class="bad">none</span>',
    esc(p.leader_epoch), esc(p.replicas.join(", ")),
    esc(p.isr.join(", ")) + (p.isr.length < p.replicas.length ? ' <span class="tag bad">under-replicated</span>' : ""),
    esc(p.log_start ?? "?"), esc(p.log_end ?? "?"), esc(p.range ?? ""),
    session.messages_enabled
      ? `<a href="#/topics/${encodeURIComponent(name)}/${p.partition}">messages</a>` : "",
  ]);
  const strip = t.ranges.filter((r) => r.active).sort((a, b) => a.lo - b.lo).map((r) =>
    `<div class="r" data-width="${r.hi - r.lo}" title="range ${r.id}">range ${esc(r.id)}: partitions ${esc(r.lo)}–${esc(r.hi - 1)}</div>`).join("");
  const active = t.ranges.filter((r) => r.active).sort((a, b) => a.lo - b.lo);
  const moves = (r) => {
    if (!writable() || !r.active) return "";
    const next = active.find((o) => o.lo === r.hi);
    return (r.hi - r.lo > 1 ? `<button data-split="${r.id}">split</button> ` : "") +
      (next ? `<button data-merge="${r.id},${next.id}">merge with ${esc(next.id)}</button>` : "");
  };
  const ranges = t.ranges.map((r) => [
    esc(r.id) + (r.active ? "" : ' <span class="tag">sealed</span>') + " " + moves(r),
    esc(`${r.lo}–${r.hi - 1}`), esc(r.parents.join(", ")),
    esc(bytes(r.bytes_in_per_sec) + "/s"),
    '<div class="chain">' + r.segments.map((s) =>
      `<span class="seg ${s.sealed ? "" : "active"}" title="epoch ${esc(s.leader_epoch)}">#${esc(s.seq)} ` +
      `[${esc(s.replicas.join(","))}] ${s.sealed ? esc(bytes(s.sealed_bytes)) : "active"}</span>`).join("") + "</div>",
  ]);
  const configs = t.configs == null ? '<p class="muted">Not allowed to describe this topic\'s configs.</p>' :
    table(["name", "value", "source"], t.configs.map((c) => [
      `<span title="${esc(c.doc)}">${esc(c.name)}</span>`, esc(c.value),
      c.source === "DYNAMIC_TOPIC_CONFIG" ? "<b>topic</b>" : esc(c.source)]));
  main.innerHTML = `<h1>${esc(t.name)} ${t.internal ? '<span class="tag">internal</span>' : ""}</h1>
    <div class="cards">${card("partitions", t.partitions.length)}${card("replication", t.replication_factor)}
      ${card("ranges", t.ranges.filter((r) => r.active).length)}${card("bytes in", bytes(t.bytes_in_per_sec) + "/s")}</div>
    <h2>Partitions</h2>
    ${table(["partition", "leader", "epoch", "replicas", "in sync", num("log start"), num("log end"), "range", ""], partitions)}
    <h2>Ranges and segments</h2>
    <div class="strip">${strip}</div>
    ${table(["range", "partitions", "parents", num("bytes in"), "segments (replicas, primary first)"], ranges)}
    <h2>Configs</h2>${configs}
    ${writable() ? `<h2>Change</h2>
    <form class="toolbar" id="set-config"><input name="key" placeholder="config" required>
      <input name="value" placeholder="value (empty: back to its default)"><button>Set config</button><span class="status"></span></form>
    <form class="toolbar" id="add-partitions"><input name="count" type="number" min="1" placeholder="new partition count" required>
      <button>Add partitions</button><span class="status"></span></form>
    <form class="toolbar" id="delete-topic"><input name="confirm" placeholder="type the topic's name to delete it" required>
      <button>Delete topic</button><span class="status"></span></form>` : ""}`;
  const path = "topics/" + encodeURIComponent(name);
  onSubmit("set-config", (f) => post(path + "/configs", f.get("value")
    ? { set: { [f.get("key")]: f.get("value") } } : { delete: [f.get("key")] }));
  onSubmit("add-partitions", (f) => post(path + "/partitions", { count: Number(f.get("count")) }));
  onSubmit("delete-topic", async (f) => {
    if (f.get("confirm") !== name) throw new Error("the name does not match");
    await post(path + "/delete");
    location.hash = "#/topics";
  });
  const moved = (p) => p.then(route, (e) => { main.insertAdjacentHTML("afterbegin", `<div class="error">${esc(e.message)}</div>`); });
  main.querySelectorAll("button[data-split]").forEach((b) => b.addEventListener("click", () =>
    moved(post(`ranges/${b.dataset.split}/split`, {}))));
  main.querySelectorAll("button[data-merge]").forEach((b) => b.addEventListener("click", () => {
    const [left, right] = b.dataset.merge.split(",").map(Number);
    moved(post("ranges/merge", { left, right }));
  }));
  // Widths through the CSSOM: the page's CSP allows no inline styles.
  main.querySelectorAll(".strip .r").forEach((r) => { r.style.flex = r.dataset.width; });
}

async function groupsPage() {
  const groups = await api("groups");
  const rows = groups.map((g) => [
    `<a href="#/groups/${encodeURIComponent(g.group_id)}">${esc(g.group_id)}</a>`,
    esc(g.state), esc(g.protocol_type), esc(g.coordinator),
  ]);
  main.innerHTML = `<h1>Consumer groups</h1>${table(["group", "state", "protocol type", "coordinator"], rows)}`;
}

async function groupPage(id) {
  const g = await api("groups/" + encodeURIComponent(id));
  const members = g.members.map((m) => [
    esc(m.member_id) + (m.group_instance_id ? ` <span class="tag">${esc(m.group_instance_id)}</span>` : ""),
    esc(m.client_id), esc(m.client_host),
    m.assignment.map(([t, ps]) => `${esc(t)}: ${esc(ps.join(", "))}`).join("<br>"),
  ]);
  const offsets = g.offsets.map((o) => [
    `<a href="#/topics/${encodeURIComponent(o.topic)}">${esc(o.topic)}</a>`, esc(o.partition),
    esc(o.committed), esc(o.log_end ?? "?"), esc(o.lag ?? "?"),
  ]);
  main.innerHTML = `<h1>${esc(g.group_id)}</h1>
    <div class="cards">${card("state", g.state)}${card("protocol", g.protocol || g.protocol_type || "none")}
      ${card("members", g.members.length)}${card("coordinator", g.coordinator)}
      ${card("total lag", g.total_lag, g.total_lag ? "bad" : "ok")}</div>
    <h2>Members</h2>${table(["member", "client id", "host", "assignment"], members)}
    <h2>Offsets and lag</h2>
    ${table(["topic", num("partition"), num("committed"), num("log end"), num("lag")], offsets)}
    ${writable() ? `<h2>Change (the group must be empty)</h2>
    <form class="toolbar" id="reset-offsets"><input name="topic" placeholder="topic" required
        value="${esc(g.offsets[0]?.topic ?? "")}">
      <select name="to"><option value="earliest">to earliest</option><option value="latest">to latest</option>
        <option value="timestamp">to time (ms)</option><option value="offset">to offset</option></select>
      <input name="value" placeholder="ms or offset"><button>Reset offsets</button><span class="status"></span></form>
    <form class="toolbar" id="delete-group"><input name="confirm" placeholder="type the group's id to delete it" required>
      <button>Delete group</button><span class="status"></span></form>` : ""}`;
  const path = "groups/" + encodeURIComponent(id);
  onSubmit("reset-offsets", (f) => post(path + "/offsets", {
    topic: f.get("topic"), to: f.get("to"), value: f.get("value") ? Number(f.get("value")) : null,
  }));
  onSubmit("delete-group", async (f) => {
    if (f.get("confirm") !== id) throw new Error("the id does not match");
    await post(path + "/delete");
    location.hash = "#/groups";
  });
}

const ACL_FIELDS = ["resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission"];

async function accessPage() {
  const [acls, users] = await Promise.all([api("acls"), api("users")]);
  // Quotas need DESCRIBE_CONFIGS on the cluster: a user without it sees the rest.
  const quotas = await api("quotas").catch(() => null);
  const w = writable();
  const aclRows = acls.map((a, i) => [
    ...ACL_FIELDS.map((f) => esc(a[f])),
    w ? `<button data-acl="${i}">remove</button>` : "",
  ]);
  const userRows = users.map((u, i) => [esc(u.name), esc(u.mechanism), esc(u.iterations),
    w ? `<button data-user="${i}">remove</button>` : ""]);
  const select = (name, options) => `<select name="${name}">${options.map((o) => `<option>${o}</option>`).join("")}</select>`;
  main.innerHTML = `<h1>ACLs and users</h1>
    <h2>ACLs</h2>
    ${table(["resource", "name", "pattern", "principal", "host", "operation", "permission", ""], aclRows)}
    ${w ? `<form class="toolbar" id="add-acl">
      ${select("resource_type", ["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID", "USER"])}
      <input name="resource_name" placeholder="resource name (* for all)" required>
      ${select("pattern_type", ["LITERAL", "PREFIXED"])}
      <input name="principal" placeholder="User:name" required>
      <input name="host" value="*">
      ${select("operation", ["READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALL"])}
      ${select("permission", ["ALLOW", "DENY"])}
      <button>Add ACL</button><span class="status"></span></form>` : ""}
    <h2>SCRAM users</h2>
    ${table(["user", "mechanism", num("iterations"), ""], userRows)}
    ${w ? `<form class="toolbar" id="add-user"><input name="name" placeholder="user" required>
      ${select("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])}
      <input name="password" type="password" placeholder="password" autocomplete="new-password" required>
      <button>Set password</button><span class="status"></span></form>` : ""}
    <h2>Client quotas</h2>
    ${quotas == null ? '<p class="muted">Not allowed to describe quotas.</p>' :
      table(["user", "client id", "quota", num("value"), ""], quotas.map((q, i) => [
        esc(q.user ?? ""), esc(q.client_id ?? ""), esc(q.key), esc(q.value),
        w ? `<button data-quota="${i}">remove</button>` : ""]))}
    ${w && quotas != null ? `<form class="toolbar" id="add-quota">
      <input name="user" placeholder="user (<default>; empty: none)">
      <input name="client_id" placeholder="client id (<default>; empty: none)">
      ${select("key", ["producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"])}
      <input name="value" type="number" step="any" min="0" placeholder="value" required>
      <button>Set quota</button><span class="status"></span></form>` : ""}
    <p class="status" id="access-status"></p>`;
  onSubmit("add-quota", (f) => post("quotas", {
    user: f.get("user") || null, client_id: f.get("client_id") || null,
    key: f.get("key"), value: Number(f.get("value")),
  }));
  main.querySelectorAll("button[data-quota]").forEach((b) => b.addEventListener("click", () =>
    post("quotas/delete", quotas[Number(b.dataset.quota)]).then(route, failed)));
  onSubmit("add-acl", (f) => post("acls", Object.fromEntries(ACL_FIELDS.map((k) => [k, f.get(k)]))));
  onSubmit("add-user", (f) => post("users", { name: f.get("name"), mechanism: f.get("mechanism"), password: f.get("password") }));
  const failed = (e) => { const s = document.getElementById("access-status"); s.textContent = e.message; s.className = "status bad"; };
  main.querySelectorAll("button[data-acl]").forEach((b) => b.addEventListener("click", () =>
    post("acls/delete", acls[Number(b.dataset.acl)]).then(route, failed)));
  main.querySelectorAll("button[data-user]").forEach((b) => b.addEventListener("click", () => {
    const u = users[Number(b.dataset.user)];
    post("users/delete", { name: u.name, mechanism: u.mechanism }).then(route, failed);
  }));
}

// Live rates: sampled every 2 s while the page is open, the last 60 kept.
let liveTimer = null;
const samples = [];

function sparkline(values) {
  const w = 240, h = 48, max = Math.max(1, ...values);
  const points = values.map((v, i) =>
    `${(i * w / Math.max(1, values.length - 1)).toFixed(1)},${(h - v * h / max).toFixed(1)}`).join(" ");
  return `<svg width="${w}" height="${h}" viewBox="0 0 ${w} ${h}"><polyline fill="none" stroke="#2f5fd0" stroke-width="1.5" points="${points}"/></svg>`;
}

function chart(label, series, format) {
  const last = series.length ? series[series.length - 1] : 0;
  return `<div class="chart"><div class="k">${esc(label)}</div><div class="v">${esc(format(last))}</div>${sparkline(series)}</div>`;
}

async function livePage() {
  const sample = await api("rates");
  samples.push(sample);
  while (samples.length > 60) samples.shift();
  const rate = (key) => samples.slice(1).map((s, i) =>
    Math.max(0, (s[key] - samples[i][key]) * 1000 / Math.max(1, s.at_ms - samples[i].at_ms)));
  const perSec = (n) => bytes(Math.round(n)) + "/s";
  const brokers = Object.keys(sample.broker_bytes_in_per_sec).map((id) =>
    chart(`broker ${id} bytes in`, samples.map((s) => s.broker_bytes_in_per_sec[id] ?? 0), perSec));
  const topics = Object.entries(sample.topic_bytes_in_per_sec).filter(([, v]) => v > 0)
    .sort((a, b) => b[1] - a[1]).slice(0, 12).map(([name]) =>
      chart(`${name} bytes in`, samples.map((s) => s.topic_bytes_in_per_sec[name] ?? 0), perSec));
  main.innerHTML = `<h1>Live <span class="muted">every 2 s, the last 2 minutes</span></h1>
    <h2>This node (${esc(sample.node_id)})</h2>
    <div class="charts">
      ${chart("produced", rate("produced_bytes"), perSec)}
      ${chart("fetched", rate("fetched_bytes"), perSec)}
      ${chart("produced batches", rate("produced_batches"), (n) => n.toFixed(0) + "/s")}
      ${chart("open connections", samples.map((s) => s.open_connections), (n) => String(n))}
    </div>
    <h2>Brokers (as their primaries report)</h2><div class="charts">${brokers.join("") || '<p class="muted">no reports yet</p>'}</div>
    <h2>Busiest topics</h2><div class="charts">${topics.join("") || '<p class="muted">no topic is being written</p>'}</div>`;
  liveTimer = setTimeout(() => { if (location.hash.startsWith("#/live")) route(); }, 2000);
}

function shown(s) {
  if (s == null) return '<span class="muted">null</span>';
  let text = s.text;
  if (text != null) {
    try { text = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* not JSON */ }
  }
  const body = text != null ? esc(text) : '<span class="muted">hex</span> ' + esc(s.hex);
  return `<pre>${body}</pre>` + (s.truncated ? `<span class="muted">${esc(bytes(s.size))}, cut</span>` : "");
}

async function messagesPage(name, partition, params) {
  const query = new URLSearchParams(params);
  query.set("limit", query.get("limit") ?? "50");
  const page = await api(`topics/${encodeURIComponent(name)}/partitions/${partition}/messages?${query}`);
  const rows = page.messages.map((m) => [
    esc(m.offset), esc(new Date(m.timestamp).toISOString()), shown(m.key), shown(m.value),
    m.headers.map(([k, v]) => `<div><b>${esc(k)}</b>: ${v == null ? "null" : esc(v.text ?? v.hex)}</div>`).join(""),
    (m.key?.truncated || m.value?.truncated)
      ? `<a href="#/topics/${encodeURIComponent(name)}/${partition}?offset=${m.offset}&limit=1&full=true">all</a>` : "",
  ]);
  const base = `#/topics/${encodeURIComponent(name)}/${partition}`;
  main.innerHTML = `<h1><a href="#/topics/${encodeURIComponent(name)}">${esc(name)}</a> / partition ${esc(partition)}</h1>
    <p class="muted">leader ${esc(page.leader)}, offsets ${esc(page.log_start)} to ${esc(page.log_end)}</p>
    <form class="toolbar" id="browse">
      <select name="mode"><option value="oldest">oldest first</option><option value="newest">newest first</option>
        <option value="offset">from offset</option><option value="timestamp">from time (ms)</option></select>
      <input name="at" placeholder="offset or ms">
      <input name="q" placeholder="key or value contains" value="${esc(params.get("q") ?? "")}">
      <button>Show</button>
      ${page.next != null && page.next < (page.log_end ?? 0) && params.get("newest") !== "true"
        ? `<a href="${base}?offset=${page.next}&q=${encodeURIComponent(params.get("q") ?? "")}">next page</a>` : ""}
    </form>
    ${table(["offset", "timestamp", "key", "value", "headers", ""], rows)}`;
  document.getElementById("browse").addEventListener("submit", (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const q = new URLSearchParams();
    const mode = f.get("mode");
    if (mode === "newest") q.set("newest", "true");
    if (mode === "offset") q.set("offset", f.get("at"));
    if (mode === "timestamp") q.set("timestamp", f.get("at"));
    if (f.get("q")) q.set("q", f.get("q"));
    location.hash = base + "?" + q;
  });
}

async function route() {
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(search ?? "");
  const parts = (path || "/cluster").split("/").filter(Boolean).map(decodeURIComponent);
  document.querySelectorAll("header nav a").forEach((a) =>
    a.classList.toggle("current", a.dataset.page === parts[0]));
  clearTimeout(liveTimer);
  try {
    if (!session) {
      session = await api("session");
      document.getElementById("session").textContent =
        `${session.principal} on node ${session.node_id}` + (session.read_only ? " (read-only)" : "");
    }
    if (parts[0] === "topics" && parts.length === 1) await topicsPage(params);
    else if (parts[0] === "topics" && parts.length === 2) await topicPage(parts[1]);
    else if (parts[0] === "topics" && parts.length === 3) await messagesPage(parts[1], parts[2], params);
    else if (parts[0] === "groups" && parts.length === 1) await groupsPage();
    else if (parts[0] === "groups" && parts.length === 2) await groupPage(parts[1]);
    else if (parts[0] === "access") await accessPage();
    else if (parts[0] === "live") await livePage();
    else await clusterPage();
  } catch (e) {
    main.innerHTML = `<div class="error">${esc(e.message)}</div>`;
  }
}

window.addEventListener("hashchange", route);
route();
