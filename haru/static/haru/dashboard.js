/* Haru dashboard: live updates over a WebSocket, confirmed actions, ticking ages.
 *
 * Plain JavaScript, no build step, no dependencies (the portal runs in closed networks).
 * Each broadcast carries the fleet's routing state (one read, as the commit left it), which is
 * applied at once, in one pass, to every part of the page it decides (the header, the roles,
 * the in-flight strip, the operation's steps; a footer written for the other role is hidden), so
 * no frame mixes two states; then the server-rendered fragment (itself one snapshot) is
 * re-fetched so everything else follows. A dropped socket reconnects
 * with exponential backoff and re-fetches the fragment on reconnect, so nothing missed while
 * disconnected stays missed.
 */
(function () {
  "use strict";

  var live = document.getElementById("live");
  var statusEl = document.getElementById("live-status");
  var REFRESH_EVERY_MS = 5000; // heartbeat ages and GPU memory change without an event
  var MAX_BACKOFF_MS = 15000;
  var skewMs = 0; // browser clock minus server clock, so ages read right on a skewed laptop

  // ---------------------------------------------------------------------------------------
  // Formatting and ticking ages
  // ---------------------------------------------------------------------------------------
  function pad(n) { return n < 10 ? "0" + n : "" + n; }

  function fmtAge(s) {
    if (s < 60) return s.toFixed(1) + "s";
    var m = Math.floor(s / 60), sec = Math.floor(s % 60);
    if (m < 60) return m + "m " + pad(sec) + "s";
    var h = Math.floor(m / 60);
    if (h < 48) return h + "h " + pad(m % 60) + "m";
    return Math.floor(h / 24) + "d " + (h % 24) + "h";
  }

  function fmtMs(ms) {
    if (ms < 1000) return Math.round(ms) + " ms";
    var s = ms / 1000;
    if (s < 60) return s.toFixed(1) + " s";
    var total = Math.round(s);
    return Math.floor(total / 60) + " m " + pad(total % 60) + " s";
  }

  // Ages tick ten times a second: sampled once a second, a heartbeat age whose period is a
  // little over a second read as a countdown (1.4, 1.2, 1.0 ... then a jump back). And an age
  // never steps back while its start is the same: a new estimate of the clock skew (each one
  // carries a request's latency) must not make the shown age jitter backwards.
  var TICK_MS = 100;
  var shown = typeof WeakMap === "function" ? new WeakMap() : null;

  function tickAges() {
    var now = Date.now() - skewMs;
    var els = document.querySelectorAll("[data-since]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i], v = el.getAttribute("data-since");
      if (!v) continue;
      var t = Date.parse(v);
      if (isNaN(t)) continue;
      var s = Math.max(0, (now - t) / 1000);
      var last = shown && shown.get(el);
      if (last && last.since === v && s < last.s) s = last.s;
      if (shown) shown.set(el, { since: v, s: s });
      el.textContent = el.getAttribute("data-format") === "ms" ? fmtMs(s * 1000) : fmtAge(s);
    }
  }

  // The server's clock read at `generated`, for a request sent at `sentAt` and answered now:
  // the middle of the round trip is the best guess of when the server read it.
  function learnSkewFrom(generated, sentAt) {
    var t = generated ? Date.parse(generated) : NaN;
    if (isNaN(t)) return;
    var now = Date.now();
    skewMs = (sentAt ? (sentAt + now) / 2 : now) - t;
  }

  function learnSkew(root, sentAt) {
    learnSkewFrom(root && root.getAttribute("data-generated-at"), sentAt);
  }

  // ---------------------------------------------------------------------------------------
  // Flash messages
  // ---------------------------------------------------------------------------------------
  function flash(message, kind) {
    var area = document.getElementById("flash");
    if (!area) return;
    var div = document.createElement("div");
    div.className = "flash flash-" + (kind || "info");
    div.textContent = message;
    area.appendChild(div);
    setTimeout(function () { div.remove(); }, kind === "error" ? 15000 : 7000);
  }

  // Server-side messages (no-script path) fade too, but errors stay longer.
  Array.prototype.forEach.call(document.querySelectorAll(".flash"), function (div) {
    setTimeout(function () { div.remove(); }, div.classList.contains("flash-error") ? 15000 : 7000);
  });

  // ---------------------------------------------------------------------------------------
  // Confirmed actions: every form with data-confirm asks first, then POSTs with its CSRF token
  // ---------------------------------------------------------------------------------------
  function askConfirm(title, text) {
    var dialog = document.getElementById("confirm-dialog");
    if (!dialog || typeof dialog.showModal !== "function") {
      return Promise.resolve(window.confirm(text));
    }
    dialog.querySelector("[data-confirm-title]").textContent = title || "Confirm";
    dialog.querySelector("[data-confirm-text]").textContent = text;
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise(function (resolve) {
      dialog.addEventListener("close", function () { resolve(dialog.returnValue === "ok"); },
        { once: true });
    });
  }

  function sendAction(form) {
    var data = new FormData(form);
    data.set("confirm", "on");
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.action, {
      method: "POST",
      body: data,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRFToken": data.get("csrfmiddlewaretoken") },
    }).then(function (r) {
      if (r.redirected && /\/login\//.test(r.url)) { window.location.reload(); return null; }
      return r.json().then(function (body) { return { r: r, body: body }; },
        function () { return { r: r, body: null }; });
    }).then(function (res) {
      if (!res) return;
      if (res.body && res.body.error) flash(res.body.error.message, "error");
      else if (res.body && res.body.message) flash(res.body.message, "success");
      else flash("request failed: HTTP " + res.r.status, "error");
      refresh();
    }).catch(function (err) {
      flash("request failed: " + err, "error");
    }).finally(function () {
      buttons.forEach(function (b) { b.disabled = false; });
    });
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.matches || !form.matches("form[data-confirm]")) return;
    ev.preventDefault();
    // A choice inside the form (the drill's mode) may say what it does in its own words.
    var chosen = form.querySelector("option:checked[data-confirm]");
    var text = chosen ? chosen.getAttribute("data-confirm") : form.getAttribute("data-confirm");
    askConfirm(form.getAttribute("data-confirm-title"), text)
      .then(function (ok) { if (ok) sendAction(form); });
  });

  if (!live) { tickAges(); setInterval(tickAges, TICK_MS); return; }

  // ---------------------------------------------------------------------------------------
  // Live state
  // ---------------------------------------------------------------------------------------
  var fleetId = live.getAttribute("data-fleet-id"); // null on the overview
  var latest = null; // newest {fleet, eventId} seen over the socket (fleet page)
  var fetching = false, dirty = false, backoff = 500, socket = null;

  function setStatus(state, text) {
    if (!statusEl) return;
    statusEl.setAttribute("data-state", state);
    statusEl.textContent = text || state;
  }

  function scopeFor(f, root) {
    if (fleetId) return f.id === fleetId ? root : null;
    return root.querySelector('[data-fleet-slug="' + f.slug + '"]');
  }

  // Apply a broadcast's state to `root` (the page, or a fetched fragment before it is shown).
  function applyState(f, root) {
    var scope = scopeFor(f, root || live);
    if (!scope) return;
    var revEls = scope.querySelectorAll("[data-route-revision]");
    var shown = revEls.length ? parseInt(revEls[0].getAttribute("data-route-revision"), 10) : 0;
    if (!(f.routeRevision < shown)) { // never move backwards past a newer fragment
      revEls.forEach(function (el) {
        el.setAttribute("data-route-revision", String(f.routeRevision));
        el.textContent = String(f.routeRevision);
      });
      var activeSlug = "";
      scope.querySelectorAll("[data-domain-id]").forEach(function (card) {
        var role = card.getAttribute("data-domain-id") === f.activeDomainId ? "active" : "standby";
        if (role === "active") activeSlug = card.getAttribute("data-domain-slug");
        if (card.getAttribute("data-role") !== role) {
          card.setAttribute("data-role", role);
          card.classList.remove("role-active", "role-standby");
          card.classList.add("role-" + role);
          var badge = card.querySelector("[data-role-badge]");
          if (badge) badge.textContent = role;
        }
      });
      var activeEl = scope.querySelector("[data-active-slug]");
      if (activeEl && activeSlug) activeEl.textContent = activeSlug;
    }
    var op = f.operation;
    var inFlight = op && (op.state === "pending" || op.state === "running");
    applyOperation(scope, op, inFlight);
    // The header's step clock counts from the step's own start, never the operation's.
    scope.querySelectorAll("[data-step-since]").forEach(function (el) {
      var since = inFlight ? (op.stepStartedAt || "") : "";
      if (el.getAttribute("data-since") !== since) {
        el.setAttribute("data-since", since);
        if (!since) el.textContent = "";
      }
    });
    scope.querySelectorAll("[data-operation-step]").forEach(function (el) {
      var step = inFlight ? (op.currentStep || "") : "";
      el.setAttribute("data-operation-step", step);
      el.textContent = step || (inFlight ? "queued" : "—");
      var holder = el.closest("[hidden]");
      if (holder && step) holder.hidden = false;
    });
  }

  function slugOf(scope, domainId) {
    var card = scope.querySelector('[data-domain-id="' + domainId + '"]');
    return card ? card.getAttribute("data-domain-slug") : "?";
  }

  // The parts of the page the message's operation decides: the header's "In flight", and the
  // operation panel's chip and steps when the panel shows that operation (steps run in order:
  // the ones before the current step have ended, the current one runs). A panel showing
  // another operation is marked behind until the fragment replaces it.
  function applyOperation(scope, op, inFlight) {
    var strip = scope.querySelector("[data-in-flight]");
    if (strip) {
      strip.replaceChildren();
      if (inFlight) {
        var name = document.createElement("span");
        name.className = "step-name";
        name.textContent = op.currentStep || "queued";
        strip.append(op.kind + " → " + slugOf(scope, op.targetDomainId) + " · ", name);
      } else {
        var none = document.createElement("span");
        none.className = "muted";
        none.textContent = "nothing";
        strip.append(none);
      }
    }
    var panel = scope.querySelector(".op-panel");
    if (!panel || !op) return;
    var chip = panel.querySelector("[data-operation-id]");
    var same = chip && chip.getAttribute("data-operation-id") === op.id;
    panel.classList.toggle("behind", !same);
    if (!same) return;
    chip.setAttribute("data-operation-state", op.state);
    chip.className = "op-chip op-" + op.state;
    chip.textContent = op.state;
    if (!inFlight || !op.currentStep) return;
    var steps = panel.querySelectorAll("[data-step]");
    var at = -1;
    steps.forEach(function (li, i) { if (li.getAttribute("data-step") === op.currentStep) at = i; });
    if (at < 0) return;
    steps.forEach(function (li, i) {
      var status = li.getAttribute("data-step-status");
      var next = status;
      if (i < at && (status === "running" || status === "pending")) next = "done";
      else if (i === at) next = "running";
      if (next === status) return;
      li.setAttribute("data-step-status", next);
      li.classList.remove("step-" + status);
      li.classList.add("step-" + next);
      var time = li.querySelector(".step-time");
      if (time && next === "running") {
        time.replaceChildren();
        var age = document.createElement("span");
        age.className = "age";
        age.setAttribute("data-since", op.stepStartedAt || "");
        age.setAttribute("data-format", "ms");
        time.append(age);
      } else if (time && status === "running") {
        time.textContent = "";
      }
    });
  }

  function swap(html, sentAt) {
    var tpl = document.createElement("template");
    tpl.innerHTML = html;
    var root = tpl.content.querySelector(".live-root");
    var seen = {};
    live.querySelectorAll("[data-event-id]").forEach(function (el) {
      seen[el.getAttribute("data-event-id")] = true;
    });
    var hadEvents = Object.keys(seen).length > 0;
    var timeline = live.querySelector(".timeline-panel");
    var scrollTop = timeline ? timeline.scrollTop : 0;
    // A choice the operator made (the drill's mode) survives the re-render.
    var kept = {};
    live.querySelectorAll("[data-keep]").forEach(function (el) {
      kept[el.getAttribute("data-keep")] = el.value;
    });
    // A message newer than the fragment (it arrived while the fragment was being rendered)
    // wins over it: patch the fragment before showing it, so the page never steps back.
    // A heartbeat the poll already showed is newer than a fragment rendered before it: keep it,
    // or the age jumps up with the fragment and back down with the next poll.
    var beats = {};
    live.querySelectorAll("[data-hb-domain] [data-since]").forEach(function (el) {
      beats[el.closest("[data-hb-domain]").getAttribute("data-hb-domain")] = el.getAttribute("data-since");
    });
    tpl.content.querySelectorAll("[data-hb-domain] [data-since]").forEach(function (el) {
      var known = beats[el.closest("[data-hb-domain]").getAttribute("data-hb-domain")];
      if (known && Date.parse(known) > Date.parse(el.getAttribute("data-since") || "")) {
        el.setAttribute("data-since", known);
      }
    });
    var fragEvent = root ? parseInt(root.getAttribute("data-last-event-id") || "0", 10) : 0;
    if (fleetId && latest && latest.eventId > fragEvent) applyState(latest.fleet, tpl.content);
    live.replaceChildren(tpl.content);
    if (hadEvents) {
      live.querySelectorAll("[data-event-id]").forEach(function (el) {
        if (!seen[el.getAttribute("data-event-id")]) el.classList.add("fresh");
      });
    }
    var newTimeline = live.querySelector(".timeline-panel");
    if (newTimeline) newTimeline.scrollTop = scrollTop;
    live.querySelectorAll("[data-keep]").forEach(function (el) {
      var value = kept[el.getAttribute("data-keep")];
      if (value !== undefined && el.querySelector('option[value="' + value + '"]')) el.value = value;
    });
    if (!polled) learnSkew(root, sentAt);
    tickAges();
  }

  function refresh() {
    if (fetching) { dirty = true; return; }
    fetching = true;
    dirty = false;
    var sentAt = Date.now();
    fetch(live.getAttribute("data-live-url"), {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "X-Requested-With": "fetch" },
    }).then(function (r) {
      if (r.redirected && /\/login\//.test(r.url)) { window.location.reload(); return null; }
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.text();
    }).then(function (html) {
      if (html !== null) swap(html, sentAt);
    }).catch(function () {
      /* the next message, reconnect or periodic refresh tries again */
    }).finally(function () {
      fetching = false;
      if (dirty) refresh();
    });
  }

  function onMessage(msg) {
    if (!msg || msg.type !== "fleet.event") return;
    var eventId = msg.event && msg.event.id ? msg.event.id : 0;
    if (msg.fleet) {
      if (fleetId && (!latest || eventId >= latest.eventId)) {
        latest = { fleet: msg.fleet, eventId: eventId || (latest ? latest.eventId : 0) };
      }
      applyState(msg.fleet);
    }
    refresh();
  }

  function connect() {
    var proto = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try {
      ws = new WebSocket(proto + window.location.host + live.getAttribute("data-ws-path"));
    } catch (e) {
      scheduleReconnect();
      return;
    }
    socket = ws;
    setStatus(backoff > 500 ? "reconnecting" : "connecting");
    ws.onopen = function () {
      backoff = 500;
      setStatus("live");
      refresh(); // resynchronise: anything broadcast while we were away is in the fragment
    };
    ws.onmessage = function (m) {
      var msg;
      try { msg = JSON.parse(m.data); } catch (e) { return; }
      onMessage(msg);
    };
    ws.onclose = function (ev) {
      if (socket !== ws) return;
      socket = null;
      if (ev.code === 4404) { setStatus("offline", "fleet gone"); return; }
      // A refused handshake (session expired) looks like any other drop to the browser; the
      // fragment fetch notices the login redirect and reloads into the login page.
      refresh();
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    var delay = backoff + Math.random() * backoff * 0.3;
    backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    setStatus("reconnecting", "reconnecting in " + Math.max(1, Math.round(delay / 1000)) + "s");
    setTimeout(connect, delay);
  }

  // Heartbeat ages: once a second, the last good heartbeat of every domain (the API's
  // lastSeenAt) is fetched and the ages tick from it, so the page shows the age the API
  // would, not one that climbs until the next fragment refresh.
  // The poll is light, so its round trip gives the better skew; the fragment's (whose clock is
  // read before a render of tens of milliseconds) is used only until the first poll answers.
  var HEARTBEATS_EVERY_MS = 1000;
  var polling = false, polled = false;

  function applyHeartbeats(body, sentAt) {
    if (!body || !body.domains) return;
    learnSkewFrom(body.generatedAt, sentAt);
    polled = true;
    var marks = live.querySelectorAll("[data-hb-domain]");
    for (var i = 0; i < marks.length; i++) {
      var mark = marks[i], hb = body.domains[mark.getAttribute("data-hb-domain")];
      if (!hb) continue;
      var age = mark.querySelector("[data-since]");
      if (age) age.setAttribute("data-since", hb.lastSeenAt || "");
      mark.classList.toggle("stale", !!hb.stale);
    }
    tickAges();
  }

  function pollHeartbeats() {
    var url = live.getAttribute("data-heartbeats-url");
    if (!url || polling || document.hidden) return;
    // The overview polls the fleets on its page only (the fragment lists them).
    var root = live.querySelector(".live-root");
    var onPage = root ? root.getAttribute("data-page-fleets") : null;
    if (!fleetId && onPage !== null) {
      url += (url.indexOf("?") < 0 ? "?" : "&") + "fleets=" + encodeURIComponent(onPage);
    }
    polling = true;
    var sentAt = Date.now();
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) { applyHeartbeats(body, sentAt); })
      .catch(function () { /* the next poll tries again */ })
      .finally(function () { polling = false; });
  }

  learnSkew(live.querySelector(".live-root"));
  tickAges();
  setInterval(tickAges, TICK_MS);
  setInterval(pollHeartbeats, HEARTBEATS_EVERY_MS);
  setInterval(function () { if (!document.hidden) refresh(); }, REFRESH_EVERY_MS);
  connect();

  // For operators' tooling and the browser test: the socket's state, read-only.
  window.haruLive = { status: function () { return statusEl ? statusEl.getAttribute("data-state") : null; } };
})();
