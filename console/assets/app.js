// The console page: polls the node's read-only JSON API every second and
// draws the whole cluster (every member's figures, gathered by this node from
// the members' consoles), the events, the hot conversations and partitions,
// members, the partition map and a conversation lookup. Every time shown is
// UTC. No dependencies.
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

  const svgNS = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs) {
    const e = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  }

  // utc formats a time as HH:MM:SS UTC (withDate: YYYY-MM-DD HH:MM:SSZ).
  function utc(t, withDate) {
    const iso = new Date(t).toISOString();
    return withDate ? iso.slice(0, 10) + " " + iso.slice(11, 19) + "Z" : iso.slice(11, 19);
  }

  // chart draws one line per node over the last windowMs up to now. A line
  // breaks (a gap, never a straight line across) where a value is null (no
  // sends in that second) and where samples are missing (the node was
  // unreachable, or not running).
  function chart(svg, keys, nodes, value, fmt, windowMs, now) {
    const W = 600, H = 160, pad = 30;
    const series = nodes.filter((n) => n.summary).map((n) => ({ node: n.nodeId, interval: n.summary.intervalMs,
      pts: n.summary.samples.map((s) => ({ t: Date.parse(s.at), v: value(s) })).filter((p) => p.t >= now - windowMs) }));
    const vals = series.flatMap((s) => s.pts.map((p) => p.v).filter((v) => v != null));
    const max = Math.max(1e-9, ...vals);
    const x = (t) => pad + ((W - pad) * (t - (now - windowMs))) / windowMs;
    const y = (v) => H - 14 - ((H - 22) * v) / max;
    const kids = [];
    [0, 0.5, 1].forEach((f) => {
      kids.push(svgEl("line", { x1: pad, x2: W, y1: y(max * f), y2: y(max * f) }));
      const t = svgEl("text", { x: 0, y: Math.max(10, y(max * f) + 3) });
      t.textContent = vals.length ? fmt(max * f) : "";
      kids.push(t);
    });
    for (const [f, anchor] of [[0, "start"], [1, "end"]]) {
      const t = svgEl("text", { x: f ? W - 2 : pad, y: H - 2, "text-anchor": anchor });
      t.textContent = utc(now - windowMs * (1 - f)) + " UTC";
      kids.push(t);
    }
    for (const s of series) {
      let seg = [];
      let prevT = null;
      const flush = () => {
        if (seg.length >= 1) {
          const pts = seg.length === 1 ? [seg[0], [seg[0][0] + 1, seg[0][1]]] : seg;
          kids.push(svgEl("polyline", { "data-node": s.node, style: "stroke:" + colorOf(s.node), points: pts.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ") }));
        }
        seg = [];
      };
      for (const p of s.pts) {
        if (p.v == null || (prevT != null && p.t - prevT > 2.5 * s.interval)) flush();
        if (p.v != null) seg.push([x(p.t), y(p.v)]);
        prevT = p.t;
      }
      flush();
    }
    svg.replaceChildren(...kids);
    keys.replaceChildren(...series.map((s) => {
      const last = s.pts[s.pts.length - 1];
      return el("span", { class: "key" }, el("span", { class: "swatch", style: "background:" + colorOf(s.node) }),
        `${s.node} ${last && last.v != null ? fmt(last.v) : "—"}  `);
    }));
  }

  const num = (v, d = 1) => (v == null ? "—" : v.toFixed(v < 10 ? d : 0));
  function bytes(v) {
    if (v == null) return "—";
    const u = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return v.toFixed(i && v < 10 ? 1 : 0) + " " + u[i];
  }
  // ofLimit shows a gauge against its limit, marked past 80 %.
  function ofLimit(v, limit, fmt) {
    if (v == null) return el("td", {}, "—");
    const high = limit && v >= 0.8 * limit;
    return el("td", { class: high ? "warn" : "", title: limit ? `${Math.round((100 * v) / limit)} % of the limit` : "" },
      `${fmt(v)} / ${limit ? fmt(limit) : "—"}`);
  }

  function renderNodes(cl) {
    const rows = cl.nodes.map((n) => {
      colorOf(n.nodeId);
      const s = n.summary && n.summary.samples.length ? n.summary.samples[n.summary.samples.length - 1] : null;
      const name = el("td", {}, el("span", { class: "swatch", style: "background:" + colorOf(n.nodeId) }),
        n.consoleUrl && !n.self ? el("a", { href: n.consoleUrl, title: "its own console" }, n.nodeId) : n.nodeId);
      const tags = el("td", {}, n.self ? el("span", { class: "tag" }, "this node") : "", n.leaving ? el("span", { class: "tag" }, "leaving") : "",
        !n.reachable ? el("span", { class: "stale", title: n.error || "" }, "unreachable: " + (n.error || "")) : "");
      if (!s) {
        return el("tr", { "data-node": n.nodeId, "data-reachable": String(n.reachable) }, name, ...Array.from({ length: 12 }, () => el("td", {}, "—")), tags);
      }
      return el("tr", { "data-node": n.nodeId, "data-reachable": String(n.reachable) }, name,
        el("td", { "data-field": "messages" }, num(s.messagesPerSec)),
        el("td", { "data-field": "transactions" }, num(s.commitsPerSec)),
        el("td", { "data-field": "latency" }, s.sendP99Ms == null ? "no sends" : `${num(s.sendP50Ms)} / ${num(s.sendP99Ms)} ms`),
        ofLimit(s.pendingSends, s.pendingSendsLimit, (v) => String(Math.round(v))),
        ofLimit(s.pendingBytes, s.pendingBytesLimit, bytes),
        el("td", {}, s.commitQueue == null ? "—" : String(s.commitQueue)),
        el("td", { "data-field": "actors" }, s.actors == null ? "—" : String(s.actors)),
        el("td", {}, num(s.forwardsPerSec)),
        el("td", { class: s.req4xxPerSec > 0 ? "warn" : "" }, `${num(s.req4xxPerSec)} (${num(s.req429PerSec)})`),
        el("td", { class: s.req5xxPerSec > 0 ? "warn" : "" }, `${num(s.req5xxPerSec)} (${num(s.req503PerSec)})`),
        s.poolMax == null ? el("td", { title: "the embedded store has no pool" }, "—") : ofLimit(s.poolAcquired, s.poolMax, (v) => String(Math.round(v))),
        el("td", {}, s.partitionsHeld == null ? "all" : String(s.partitionsHeld)),
        tags);
    });
    $("nodes").tBodies[0].replaceChildren(...rows);
    const up = cl.nodes.filter((n) => n.reachable).length;
    $("clustersummary").textContent = `${cl.nodes.length} node${cl.nodes.length === 1 ? "" : "s"}` + (up < cl.nodes.length ? `, ${cl.nodes.length - up} unreachable` : "");
    // The window: since the oldest sample any node has (at least a minute,
    // at most the five minutes a node keeps).
    const now = Date.parse(cl.at);
    const oldest = Math.min(now, ...cl.nodes.filter((n) => n.summary && n.summary.samples.length).map((n) => Date.parse(n.summary.samples[0].at)));
    const win = Math.min(300000, Math.max(60000, now - oldest));
    chart($("chart-msgs"), $("keys-msgs"), cl.nodes, (s) => s.messagesPerSec, (v) => v.toFixed(v < 10 ? 1 : 0), win, now);
    chart($("chart-tx"), $("keys-tx"), cl.nodes, (s) => s.commitsPerSec, (v) => v.toFixed(v < 10 ? 1 : 0), win, now);
    chart($("chart-p99"), $("keys-p99"), cl.nodes, (s) => s.sendP99Ms, (v) => v.toFixed(v < 10 ? 1 : 0), win, now);
    chart($("chart-p50"), $("keys-p50"), cl.nodes, (s) => s.sendP50Ms, (v) => v.toFixed(v < 10 ? 1 : 0), win, now);
  }

  function renderEvents(cl) {
    const rows = cl.events.map((e) => el("tr", { class: "ev-" + e.kind, "data-kind": e.kind, "data-node": e.node },
      el("td", {}, utc(e.at, true)), el("td", {}, e.kind), el("td", {}, e.node),
      el("td", {}, e.partitions ? String(e.partitions) : ""), el("td", {}, e.detail), el("td", { class: "muted" }, e.observer)));
    $("events").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 6, class: "muted" }, "nothing since the oldest running node started"))]));
  }

  function renderHot(cl, parts) {
    $("hotsummary").textContent = `sends/s received by the nodes over the last ${Math.round(cl.hotSecs)} s`;
    if (cl.hotConversationsNeedToken) {
      $("token").hidden = false;
      $("hot-convs").tBodies[0].replaceChildren(el("tr", {}, el("td", { colSpan: 3, class: "muted" },
        "conversation ids need this node's bearer token: enter it in the lookup below")));
    } else $("hot-convs").tBodies[0].replaceChildren(...(cl.hotConversations || []).map((h) => el("tr", { "data-conv": h.convId },
      el("td", {}, h.convId), el("td", {}, h.partition == null ? "—" : String(h.partition)), el("td", {}, num(h.sendsPerSec)))));
    $("hot-parts").tBodies[0].replaceChildren(...cl.hotPartitions.map((h) => {
      const owner = parts.partitions[h.partition] ? parts.partitions[h.partition].owner : "";
      return el("tr", { "data-p": String(h.partition) }, el("td", {}, String(h.partition)),
        el("td", {}, owner ? el("span", { class: "swatch", style: "background:" + colorOf(owner) }) : "", owner || "none"), el("td", {}, num(h.sendsPerSec)));
    }));
  }

  async function poll() {
    // Workers apart: their pings must not hold up the rest.
    getJSON("workers").then(renderWorkers, (e) => { $("workersummary").textContent = "cannot list workers: " + e.message; });
    try {
      const [members, parts, cl] = await Promise.all([getJSON("members"), getJSON("partitions"), getJSON("cluster")]);
      renderMembers(members, parts);
      renderPartitions(parts);
      renderNodes(cl);
      renderEvents(cl);
      renderHot(cl, parts);
      $("status").textContent = "updated " + utc(Date.now()) + " UTC";
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
        el("td", {}, m.clientMsgId), el("td", {}, utc(m.serverAt, true)), el("td", {}, m.bodyBytes + " B" + (m.state ? " · " + m.state : ""))));
      out.replaceChildren(
        el("p", {}, "head seq ", el("b", { id: "headseq" }, c.headSeq), c.messages.length ? ` · last ${c.messages.length} messages, newest first` : " · no messages"),
        c.readState ? el("p", { id: "readstate" }, `uid ${c.readState.uid}: read up to seq `, el("b", {}, c.readState.readSeq), ` · unread `, el("b", {}, c.readState.unread)) : "",
        el("table", {}, el("thead", {}, el("tr", {}, ...["seq", "msg_id", "from_uid", "type", "client_msg_id", "server_at (UTC)", "body"].map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
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
