// The firehose card: this node's backlog towards NATS JetStream
// (docs/FEED.md), polled every second from api/firehose. The card stays
// hidden on a node without --feed-nats (the endpoint answers 404).
"use strict";
(function () {
  const main = document.querySelector("main");
  const section = document.createElement("section");
  section.id = "firehose-section";
  section.hidden = true;
  section.innerHTML = '<h2>Firehose <span class="muted">this node\'s backlog towards NATS JetStream</span></h2>' +
    '<p id="firehose-summary"></p>' +
    '<table id="firehose-behind"><thead><tr><th>partition</th><th>messages owed</th></tr></thead><tbody></tbody></table>';
  main.insertBefore(section, main.children[1] || null);

  function render(f) {
    section.hidden = false;
    const state = f.publishing ? "publishing" : "NOT publishing (broker unreachable: sends go on, the backlog waits in the store)";
    document.getElementById("firehose-summary").textContent =
      `${state}; backlog ${f.lagMessages} messages, oldest ${f.lagSeconds.toFixed(1)} s; ` +
      `${f.published} published, ${f.errors} failed publishes; ${f.partitions} partitions published by this node`;
    const body = document.getElementById("firehose-behind").tBodies[0];
    body.replaceChildren(...f.behind.map((p) => {
      const tr = document.createElement("tr");
      for (const v of [p.partition, p.messages]) {
        const td = document.createElement("td");
        td.textContent = String(v);
        tr.append(td);
      }
      return tr;
    }));
  }

  function poll() {
    fetch("api/firehose", { cache: "no-store" })
      .then((r) => (r.ok ? r.json() : null))
      .then((f) => { if (f) render(f); else section.hidden = true; }, () => {})
      .finally(() => setTimeout(poll, 1000));
  }
  poll();
})();
