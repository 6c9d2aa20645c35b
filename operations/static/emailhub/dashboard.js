// emailhub admin dashboard (operations/dashboard.py): every few seconds, fetch the JSON of the
// same page (same origin, the session cookie) and redraw each section. Text only (textContent),
// never markup from the data.
(function () {
  "use strict";

  function cell(row, text, className) {
    var td = document.createElement("td");
    if (className) { td.className = className; }
    td.textContent = text === null || text === undefined ? "" : String(text);
    row.appendChild(td);
    return td;
  }

  function linkCell(row, href, text) {
    var td = document.createElement("td");
    var a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    td.appendChild(a);
    row.appendChild(td);
    return td;
  }

  function empty(tbody, columns, text) {
    var row = document.createElement("tr");
    row.className = "empty";
    var td = cell(row, text);
    td.colSpan = columns;
    tbody.appendChild(row);
  }

  function campaigns(tbody, rows) {
    tbody.replaceChildren();
    if (!rows.length) { empty(tbody, 10, "No campaign is scheduled, sending or paused."); return; }
    rows.forEach(function (c) {
      var row = document.createElement("tr");
      row.className = "campaign-row";
      row.dataset.campaignId = c.id;
      var name = linkCell(row, c.url, c.name);
      var quiet = document.createElement("span");
      quiet.className = "quiet";
      quiet.textContent = " #" + c.id + " · " + c.priority + " · " + c.schedule_type;
      name.appendChild(quiet);
      // Nothing sent yet and nothing due before next_send_at: say when, not "sending 0%".
      var status = c.waiting ? "waiting — next send at " + c.next_send_display +
        (c.status === "sending" && !c.fanout_done ? " (fan-out running)" : "") :
        c.status + (c.fanout_done ? "" : " (fan-out running)");
      cell(row, status, "campaign-status");
      var td = document.createElement("td");
      var bar = document.createElement("progress");
      bar.className = "campaign-progress";
      bar.dataset.campaignId = c.id;
      bar.max = 100;
      bar.value = c.percent;
      bar.setAttribute("aria-valuemin", "0");
      bar.setAttribute("aria-valuemax", "100");
      bar.setAttribute("aria-valuenow", String(c.percent));
      bar.setAttribute("aria-label", c.name + ": " + c.percent + "% finished");
      td.appendChild(bar);
      var pct = document.createElement("span");
      pct.className = "campaign-percent";
      pct.textContent = " " + c.percent + "%";
      td.appendChild(pct);
      row.appendChild(td);
      cell(row, c.sent, "campaign-sent");
      cell(row, c.failed, "campaign-failed");
      cell(row, c.suppressed + c.cancelled, "campaign-other");
      cell(row, c.total, "campaign-total");
      cell(row, c.rate_per_second === null ? "-" :
        c.rate_per_second + "/s" + (c.rate_basis === "since_start" ? " (avg)" : ""), "campaign-rate");
      var eta = cell(row, c.eta_display, "campaign-eta");
      eta.dataset.etaSeconds = c.eta_seconds === null ? "" : String(c.eta_seconds);
      cell(row, c.started_at_display, "campaign-started");
      tbody.appendChild(row);
    });
  }

  function queue(tbody, snapshot) {
    tbody.replaceChildren();
    Object.keys(snapshot).forEach(function (priority) {
      var row = document.createElement("tr");
      row.className = "queue-row";
      row.dataset.priority = priority;
      cell(row, priority);
      cell(row, snapshot[priority].pending, "queue-pending");
      cell(row, snapshot[priority].processing, "queue-processing");
      tbody.appendChild(row);
    });
  }

  function providers(tbody, rows) {
    tbody.replaceChildren();
    rows.forEach(function (p) {
      var row = document.createElement("tr");
      row.className = "provider-row";
      row.dataset.provider = p.name;
      row.dataset.endpoint = p.endpoint;
      cell(row, p.name);
      cell(row, p.endpoint, "provider-endpoint");
      cell(row, p.pools.join(", "));
      cell(row, p.circuit.state, "provider-circuit circuit-" + p.circuit.state);
      cell(row, p.circuit.fail_counter + "/" + p.circuit.fail_max);
      cell(row, p.rate_limit ? p.rate_limit.per_second + "/s, " +
        (p.rate_limit.tokens === null ? "?" : p.rate_limit.tokens) + " tokens" : "unlimited", "provider-rate");
      cell(row, p.circuit.last_error ? p.circuit.last_error + " (at " + p.circuit.last_error_at_display + ")" : "",
        "provider-error");
      tbody.appendChild(row);
    });
  }

  function failures(tbody, rows) {
    tbody.replaceChildren();
    if (!rows.length) { empty(tbody, 7, "No failed message among the newest."); return; }
    rows.forEach(function (f) {
      var row = document.createElement("tr");
      row.className = "failure-row";
      row.dataset.messageId = f.id;
      linkCell(row, f.url, "#" + f.id);
      cell(row, f.to_email);
      cell(row, f.priority);
      cell(row, f.provider);
      cell(row, f.attempts);
      cell(row, f.last_error, "failure-error");
      cell(row, f.at_display);
      tbody.appendChild(row);
    });
  }

  function feedback(tbody, rows) {
    tbody.replaceChildren();
    if (!rows.length) { empty(tbody, 7, "No bounce or complaint among the newest events."); return; }
    rows.forEach(function (e) {
      var row = document.createElement("tr");
      row.className = "feedback-row";
      row.dataset.eventId = e.id;
      linkCell(row, e.url, "#" + e.id);
      cell(row, e.kind + (e.bounce ? " (" + e.bounce + ")" : ""));
      cell(row, e.recipient);
      cell(row, e.provider);
      cell(row, e.detail);
      cell(row, e.message_id);
      cell(row, e.occurred_at_display);
      tbody.appendChild(row);
    });
  }

  function webhooks(tbody, rows) {
    tbody.replaceChildren();
    if (!rows.length) { empty(tbody, 4, "Every endpoint is delivering."); return; }
    rows.forEach(function (e) {
      var row = document.createElement("tr");
      row.className = "webhook-row";
      row.dataset.endpointId = e.id;
      linkCell(row, e.admin_url, "#" + e.id);
      cell(row, e.url);
      cell(row, e.enabled ? "failing since " + e.failing_since_display : "disabled");
      cell(row, e.reason);
      tbody.appendChild(row);
    });
  }

  function start() {
    var root = document.getElementById("dashboard");
    if (!root) { return; }
    var url = root.dataset.url;
    var every = Math.max(1, parseInt(root.dataset.refreshSeconds, 10) || 5) * 1000;
    var status = document.getElementById("dashboard-status");

    function refresh() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}, cache: "no-store"})
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.json();
        })
        .then(function (data) {
          campaigns(document.getElementById("campaign-rows"), data.campaigns);
          queue(document.getElementById("queue-rows"), data.queue);
          providers(document.getElementById("provider-rows"), data.providers);
          failures(document.getElementById("failure-rows"), data.recent_failures);
          feedback(document.getElementById("feedback-rows"), data.recent_feedback);
          webhooks(document.getElementById("webhook-rows"), data.webhook_endpoints);
          document.getElementById("dashboard-updated").textContent = data.generated_at_display;
          root.dataset.refreshedAt = data.generated_at;
          status.textContent = "";
        })
        .catch(function (error) {
          status.textContent = "(refresh failed: " + error.message + "; retrying)";
        })
        .finally(function () { window.setTimeout(refresh, every); });
    }
    window.setTimeout(refresh, every);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
