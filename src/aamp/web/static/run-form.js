// The start-run form's check before upload: each chosen file's type, and the files' total
// size, against what a run of the chosen version accepts — its policy's data.inbound, read
// from GET /v1/agents/ID/inbound, which allowed() decides exactly as starting that run. A
// file the policy refuses is named with the rule, and the form is not sent (no byte leaves
// the browser). The server's check when the run starts stays the authority.
(function () {
  "use strict";

  function extension(name) {
    var dot = name.lastIndexOf(".");
    return dot >= 0 ? name.slice(dot + 1).toLowerCase() : "";
  }

  // The first rule the chosen files break, worded as the server words it, or "".
  function refusal(files, inbound) {
    var total = 0;
    for (var i = 0; i < files.length; i++) {
      var name = files[i].name;
      var kind = extension(name);
      if (inbound.types.indexOf(kind) < 0) {
        return name + ": data.inbound.types of policy '" + inbound.policy +
          "' does not allow '" + (kind || "no extension") + "' (allowed: " +
          (inbound.types.join(", ") || "none") + ")";
      }
      total += files[i].size;
      if (total > inbound.max_bytes) {
        return "inputs: data.inbound.max_bytes of policy '" + inbound.policy + "' is " +
          inbound.max_bytes + " bytes; these files are " + total + " bytes or more";
      }
    }
    return "";
  }

  function setUp(form) {
    var input = form.querySelector("input[type=file]");
    var version = form.querySelector("select[name=version]");
    var shown = document.getElementById(form.getAttribute("data-check-into"));
    var inbound = null;

    function check() {
      var message = inbound ? refusal(input.files, inbound) : "";
      input.setCustomValidity(message);
      shown.textContent = message;
      shown.hidden = message === "";
      if (message) {
        input.setAttribute("aria-invalid", "true");
      } else {
        input.removeAttribute("aria-invalid");
      }
    }

    function load() {
      inbound = null;
      var url = form.getAttribute("data-inbound") + "?version=" +
        encodeURIComponent(version ? version.value : "latest");
      fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (found) { inbound = found; check(); })
        .catch(function () { inbound = null; check(); });
    }

    input.addEventListener("change", check);
    if (version) {
      version.addEventListener("change", load);
    }
    form.addEventListener("submit", function (event) {
      check();
      if (input.validationMessage) {
        event.preventDefault();
        input.focus();
      }
    });
    load();
  }

  function start() {
    var forms = document.querySelectorAll("form[data-inbound]");
    for (var i = 0; i < forms.length; i++) {
      setUp(forms[i]);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
