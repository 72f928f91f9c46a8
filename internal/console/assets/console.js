// The console's live updates. A part of a page that depends on events
// declares them: data-live="machine.*,workflow.*" (event types or globs, as
// the API's stream filters them) and, optionally, data-live-id="ID" (only
// events about that resource: its id, or a workflow's target). It has an
// id and data-live-src, the page to fetch it from: when a matching event
// arrives on /console/live, htmx fetches that page again and swaps in the
// element with the same id. One EventSource per tab, reopened only when
// the set of declared types changes (after htmx swaps a page in).
(function () {
  "use strict";

  var source = null;
  var current = "";
  var pending = [];
  var timer = null;
  var root = document.documentElement;

  function globs(el) {
    return el.getAttribute("data-live").split(",").map(function (g) { return g.trim(); })
      .filter(function (g) { return g !== ""; });
  }

  // matches is the API's path.Match for event types (which hold no
  // slash): "*" is any run of characters.
  function matches(glob, type) {
    var re = "^" + glob.replace(/[.+^${}()|[\]\\?]/g, "\\$&").replace(/\*/g, ".*") + "$";
    return new RegExp(re).test(type);
  }

  function about(ev, id) {
    return ev.resourceId === id || (ev.data && ev.data.target_id === id);
  }

  // busy holds the ids of parts whose refresh is in flight; again, those
  // an event reached meanwhile: they are fetched once more when it ends,
  // so the last event's state is what stays on the page.
  var busy = {};
  var again = {};

  function refreshOne(id) {
    if (busy[id]) {
      again[id] = true;
      return;
    }
    var el = document.getElementById(id);
    if (el === null || !el.hasAttribute("data-live-src")) {
      return;
    }
    busy[id] = true;
    htmx.ajax("GET", el.getAttribute("data-live-src"), { source: el, target: el, select: "#" + id, swap: "outerHTML" })
      .finally(function () {
        delete busy[id];
        if (again[id]) {
          delete again[id];
          refreshOne(id);
        }
      });
  }

  function refresh() {
    timer = null;
    var els = pending;
    pending = [];
    els.forEach(function (el) {
      if (el.id) {
        refreshOne(el.id);
      }
    });
  }

  function deliver(msg) {
    var ev;
    try {
      ev = JSON.parse(msg.data);
    } catch (e) {
      return;
    }
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var id = el.getAttribute("data-live-id");
      if (id && !about(ev, id)) {
        return;
      }
      if (!globs(el).some(function (g) { return matches(g, ev.type); })) {
        return;
      }
      if (pending.indexOf(el) < 0) {
        pending.push(el);
      }
    });
    // A burst of events (a workflow's steps) is one refresh.
    if (pending.length > 0 && timer === null) {
      timer = setTimeout(refresh, 100);
    }
  }

  function sync() {
    var set = {};
    document.querySelectorAll("[data-live]").forEach(function (el) {
      globs(el).forEach(function (g) { set[g] = true; });
    });
    // Signed-in pages name the stream; the sign-in page does not.
    var host = document.querySelector("[data-live-url]");
    var types = host === null ? "" : Object.keys(set).sort().join(",");
    if (types === current) {
      return;
    }
    if (source !== null) {
      source.close();
      source = null;
    }
    current = types;
    // What the stream carries, for people and tests to see.
    root.setAttribute("data-live-types", types);
    root.setAttribute("data-live-state", types === "" ? "closed" : "connecting");
    if (types === "") {
      return;
    }
    var url = host.getAttribute("data-live-url") + "?types=" + encodeURIComponent(types);
    var tenant = new URLSearchParams(window.location.search).get("tenant");
    if (tenant) {
      url += "&tenant=" + encodeURIComponent(tenant);
    }
    source = new EventSource(url);
    source.onmessage = deliver;
    // Events between the page's drawing and the stream's (re)opening are
    // not replayed: refresh every live part once it is open.
    source.onopen = function () {
      root.setAttribute("data-live-state", "open");
      document.querySelectorAll("[data-live]").forEach(function (el) {
        if (pending.indexOf(el) < 0) {
          pending.push(el);
        }
      });
      if (timer === null) {
        timer = setTimeout(refresh, 100);
      }
    };
    source.onerror = function () {
      root.setAttribute("data-live-state", "reconnecting");
    };
  }

  function start() {
    sync();
    document.body.addEventListener("htmx:afterSettle", sync);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
