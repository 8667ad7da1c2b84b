// The conversation view tails live (console/tail.go): after each lookup,
// the rows of the conversation's new messages are added at the top as they
// are committed, from /console/api/tail (the node's change feed), and the
// head seq follows. The stream resumes from the last seq shown when it
// ends. A new lookup replaces the tail.
(() => {
  "use strict";
  const api = "/console/api/";
  const tokenKey = "sequencer-console-token";
  const result = document.getElementById("convresult");
  let current = null; // the AbortController of the tail under way

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  // As the lookup shows server_at (app.js utc(t, true)).
  function utcDate(t) {
    const iso = new Date(t).toISOString();
    return iso.slice(0, 10) + " " + iso.slice(11, 19) + "Z";
  }

  function addRow(m) {
    const tbody = result.querySelector("tbody");
    if (!tbody) return;
    const tr = document.createElement("tr");
    tr.dataset.seq = m.seq;
    tr.className = "live";
    tr.append(cell(m.seq), cell(m.msgId), cell(m.fromUid), cell(m.msgType), cell(m.clientMsgId), cell(utcDate(m.serverAt)), cell(m.bodyBytes + " B"));
    tbody.prepend(tr);
    const head = document.getElementById("headseq");
    if (head) head.textContent = m.seq;
  }

  function state(text, cls) {
    let p = document.getElementById("tailstate");
    if (!p) {
      // Beside the result, not in it: the observer below watches it.
      p = document.createElement("p");
      p.id = "tailstate";
      result.before(p);
    }
    p.textContent = text;
    p.className = cls || "muted";
  }

  async function tail(conv, after, ctl) {
    while (!ctl.signal.aborted) {
      const headers = {};
      const token = sessionStorage.getItem(tokenKey);
      if (token) headers.Authorization = "Bearer " + token;
      try {
        const r = await fetch(api + "tail?conv_id=" + encodeURIComponent(conv) + "&after_seq=" + after, { headers, signal: ctl.signal, cache: "no-store" });
        if (!r.ok) {
          state("live tail unavailable: HTTP " + r.status, "stale");
          if (r.status === 501 || r.status === 400 || r.status === 401) return;
        } else {
          state("live: new messages appear at the top as they are stored");
          const reader = r.body.getReader();
          const dec = new TextDecoder();
          let buf = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += dec.decode(value, { stream: true });
            let i;
            while ((i = buf.indexOf("\n\n")) >= 0) {
              const block = buf.slice(0, i);
              buf = buf.slice(i + 2);
              const ev = /^event: (\w+)$/m.exec(block);
              const data = /^data: (.*)$/m.exec(block);
              if (!ev || !data) continue;
              if (ev[1] === "message") {
                const m = JSON.parse(data[1]);
                after = m.seq;
                addRow(m);
              } else if (ev[1] === "end") {
                state("live tail ended (" + JSON.parse(data[1]).error + "): resuming", "stale");
              }
            }
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        state("live tail interrupted: resuming", "stale");
      }
      await new Promise((res) => setTimeout(res, 1000));
    }
  }

  // A lookup replaces the result's children: start tailing what it shows.
  new MutationObserver(() => {
    if (current) current.abort();
    current = null;
    const head = document.getElementById("headseq");
    if (!head) { // an error, not a conversation
      state("");
      return;
    }
    const ctl = new AbortController();
    current = ctl;
    tail(document.getElementById("conv").value, head.textContent, ctl);
  }).observe(result, { childList: true });
})();
