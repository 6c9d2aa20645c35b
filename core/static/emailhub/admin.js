// emailhub admin frame: remember the browser's timezone for the server (cookie emailhub_tz,
// read by core/operator_zone.py) the first time; an operator's choice on /admin/timezone/
// is never overwritten. Same origin, no external asset.
(function () {
  "use strict";
  if (document.cookie.split("; ").some(function (c) { return c.indexOf("emailhub_tz=") === 0; })) {
    return;
  }
  var zone;
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  } catch (e) {
    return;
  }
  if (!zone || !/^[A-Za-z0-9_+\/-]+$/.test(zone)) {
    return;
  }
  var secure = window.location.protocol === "https:" ? "; Secure" : "";
  document.cookie = "emailhub_tz=" + zone + "; Max-Age=31536000; Path=/; SameSite=Lax" + secure;
}());
