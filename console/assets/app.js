// The console page: polls the node's read-only JSON API every second and
// draws members, the partition map, rates and latency. No dependencies.
"use strict";
(function () {
  const api = "api/";
  const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  const colors = new Map(); // node id -> colour, stable for the page's life
  const lastOwner = []; // partition -> owner at the previous poll
  const movedAt = []; // partition -> when the page saw its owner change
  const movedFor = 10000; // how long a moved partition stays outlined (ms)
  const $ = (id) => document.getElementById(id);

  function colorOf(node) {
    if (!node) return "";
    if (!colors.has(node)) colors.set(node, palette[colors.size % palette.length]);
    return colors.get(node);
  }

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "style") e.style.cssText = v;
      else if (k.startsWith("data-") || k === "title" || k === "class") e.setAttribute(k === "class" ? "class" : k, v);
      else e[k] = v;
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }

  // The bearer token for conversation lookups on a node with
  // --auth-token-file; kept for this tab only.
  const tokenKey = "sequencer-console-token";

  async function getJSON(path) {
    const headers = {};
    const token = sessionStorage.getItem(tokenKey);
    if (token) headers.Authorization = "Bearer " + token;
    const r = await fetch(api + path, { cache: "no-store", headers });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      const e = new Error(body.error || r.status + " " + r.statusText);
      e.status = r.status;
      throw e;
    }
    return body;
  }

  function age(ms) {
    return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(1) + " s";
  }

  function renderMembers(m, parts) {
    $("node").textContent = "node " + m.node;
    $("version").textContent = "membership version " + m.membershipVersion;
    const held = new Map();
    for (const p of parts.partitions) if (p.owner) held.set(p.owner, (held.get(p.owner) || 0) + 1);
    m.members.slice().sort((a, b) => a.nodeId.localeCompare(b.nodeId)).forEach((x) => colorOf(x.nodeId));
    const rows = m.members.map((x) => {
      const stale = x.heartbeatAgeMs > 1000; // the default heartbeat is 250 ms
      return el("tr", { "data-node": x.nodeId },
        el("td", {}, el("span", { class: "swatch", style: "background:" + colorOf(x.nodeId) }), x.nodeId),
        el("td", {}, x.apiAddr || "—"),
        el("td", {}, x.clusterAddr || "—"),
        el("td", {}, x.version || "—"),
        el("td", { class: stale ? "stale" : "", "data-age-ms": String(x.heartbeatAgeMs) }, age(x.heartbeatAgeMs)),
        el("td", {}, parts.partitions.length ? String(held.get(x.nodeId) || 0) : "all"),
        el("td", {}, x.self ? el("span", { class: "tag" }, "this node") : "", x.leaving ? el("span", { class: "tag" }, "leaving") : ""));
    });
    $("members").tBodies[0].replaceChildren(...rows);
  }

  // The workers of a distributed store (Citus); the section stays hidden
  // on other stores.
  function renderWorkers(w) {
    $("workers-section").hidden = !w.distributed;
    if (!w.distributed) return;
    const down = w.workers.filter((x) => !x.reachable).length;
    $("workersummary").textContent = `${w.workers.length} workers` +
      (down ? ` · ${down} unreachable: the conversations of its shards get unavailable, the others keep going` : "");
    $("workers").tBodies[0].replaceChildren(...w.workers.map((x) =>
      el("tr", { "data-worker": x.addr, "data-reachable": String(x.reachable) },
        el("td", {}, x.addr),
        el("td", {}, String(x.shards)),
        el("td", { class: x.reachable ? "" : "stale" }, x.reachable ? "yes" : "no"))));
  }

  function renderPartitions(parts) {
    const map = $("partmap");
    const ps = parts.partitions;
    if (ps.length === 0) {
      map.replaceChildren(el("span", { class: "muted" }, "single node: it owns every conversation"));
      $("legend").replaceChildren();
      $("partsummary").textContent = "";
      return;
    }
    if (map.children.length !== ps.length || !map.firstChild.dataset) {
      map.replaceChildren(...ps.map((_, i) => el("div", { class: "cell", "data-p": String(i) })));
    }
    const counts = new Map();
    let moved = 0;
    ps.forEach((p, i) => {
      const c = map.children[i];
      c.dataset.owner = p.owner;
      c.dataset.epoch = p.epoch;
      c.style.background = p.owner ? colorOf(p.owner) : "";
      c.title = `partition ${i} · owner ${p.owner || "none"} · epoch ${p.epoch}` + (p.ringOwner && p.ringOwner !== p.owner ? ` · moving to ${p.ringOwner}` : "");
      if (lastOwner[i] !== undefined && lastOwner[i] !== p.owner) movedAt[i] = Date.now();
      const recent = movedAt[i] !== undefined && Date.now() - movedAt[i] < movedFor;
      c.classList.toggle("moved", recent);
      if (recent) moved++;
      lastOwner[i] = p.owner;
      counts.set(p.owner || "", (counts.get(p.owner || "") || 0) + 1);
    });
    $("partsummary").textContent = `${ps.length} partitions` + (moved ? ` · ${moved} changed owner in the last ${movedFor / 1000} s (outlined)` : "");
    $("legend").replaceChildren(...[...counts.entries()].sort().map(([o, n]) =>
      el("span", { "data-legend": o }, el("span", { class: "swatch", style: o ? "background:" + colorOf(o) : "background:#cfd6dd" }), `${o || "no owner"}: ${n}`)));
  }

  function chart(svg, series, fmt) {
    const W = 600, H = 160, pad = 24;
    const n = Math.max(2, ...series.map((s) => s.length));
    const max = Math.max(1e-9, ...series.flatMap((s) => s.filter((v) => v != null)));
    const x = (i, len) => pad + ((W - pad) * (i + n - len)) / (n - 1);
    const y = (v) => H - 4 - ((H - 12) * v) / max;
    const kids = [0, 0.5, 1].map((f) => {
      const g = document.createElementNS("http://www.w3.org/2000/svg", "g");
      const l = document.createElementNS("http://www.w3.org/2000/svg", "line");
      l.setAttribute("x1", pad); l.setAttribute("x2", W); l.setAttribute("y1", y(max * f)); l.setAttribute("y2", y(max * f));
      const t = document.createElementNS("http://www.w3.org/2000/svg", "text");
      t.setAttribute("x", 0); t.setAttribute("y", Math.max(10, y(max * f) + 3)); t.textContent = fmt(max * f);
      g.append(l, t);
      return g;
    });
    series.forEach((s, k) => {
      const pl = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      pl.setAttribute("class", "s" + (k + 1));
      pl.setAttribute("points", s.map((v, i) => (v == null ? null : `${x(i, s.length).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean).join(" "));
      kids.push(pl);
    });
    svg.replaceChildren(...kids);
  }

  function renderMetrics(m) {
    const s = m.samples;
    chart($("chart-rate"), [s.map((x) => x.commitsPerSec), s.map((x) => x.messagesPerSec)], (v) => v.toFixed(v < 10 ? 1 : 0));
    chart($("chart-lat"), [s.map((x) => x.sendP50Ms), s.map((x) => x.sendP99Ms)], (v) => v.toFixed(v < 10 ? 1 : 0));
    const last = s[s.length - 1];
    $("rate-now").textContent = last ? `now ${last.commitsPerSec.toFixed(1)} tx/s, ${last.messagesPerSec.toFixed(1)} msg/s · last ${Math.round((s.length * m.intervalMs) / 1000)} s` : "";
    $("lat-now").textContent = last && last.sendP99Ms != null ? `now p50 ${last.sendP50Ms.toFixed(1)} ms, p99 ${last.sendP99Ms.toFixed(1)} ms` : "no sends in the last interval";
  }

  async function poll() {
    // Workers apart: their pings must not hold up the rest.
    getJSON("workers").then(renderWorkers, (e) => { $("workersummary").textContent = "cannot list workers: " + e.message; });
    try {
      const [members, parts, metrics] = await Promise.all([getJSON("members"), getJSON("partitions"), getJSON("metrics")]);
      renderMembers(members, parts);
      renderPartitions(parts);
      renderMetrics(metrics);
      $("status").textContent = "updated " + new Date().toLocaleTimeString();
      $("status").className = "status";
    } catch (e) {
      $("status").textContent = "cannot reach this node: " + e.message;
      $("status").className = "status err";
    }
  }

  $("lookup").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = $("convresult");
    const tok = $("token");
    if (!tok.hidden && tok.value) sessionStorage.setItem(tokenKey, tok.value.trim());
    try {
      const uid = $("uid").value.trim();
      const c = await getJSON("conversation?conv_id=" + encodeURIComponent($("conv").value) + (uid ? "&uid=" + encodeURIComponent(uid) : ""));
      const rows = c.messages.map((m) => el("tr", { "data-seq": m.seq },
        el("td", {}, m.seq), el("td", {}, m.msgId), el("td", {}, m.fromUid), el("td", {}, m.msgType),
        el("td", {}, m.clientMsgId), el("td", {}, new Date(m.serverAt).toISOString()), el("td", {}, m.bodyBytes + " B")));
      out.replaceChildren(
        el("p", {}, "head seq ", el("b", { id: "headseq" }, c.headSeq), c.messages.length ? ` · last ${c.messages.length} messages, newest first` : " · no messages"),
        c.readState ? el("p", { id: "readstate" }, `uid ${c.readState.uid}: read up to seq `, el("b", {}, c.readState.readSeq), ` · unread `, el("b", {}, c.readState.unread)) : "",
        el("table", {}, el("thead", {}, el("tr", {}, ...["seq", "msg_id", "from_uid", "type", "client_msg_id", "server_at", "body"].map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
    } catch (e) {
      if (e.status === 401) {
        sessionStorage.removeItem(tokenKey);
        tok.hidden = false;
        tok.focus();
      }
      out.replaceChildren(el("p", { class: "stale" }, e.message));
    }
  });

  poll();
  setInterval(poll, 1000);
})();
