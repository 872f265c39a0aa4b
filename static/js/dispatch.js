/* dispatch's dashboard, the little script it needs:
   - every data table (.table) names its columns on each cell (data-label, from its header), so that on a
     narrow screen the CSS can show each row as a stack of "label: value" lines;
   - live parts polled by htmx send the ETag they were rendered with (data-etag) as If-None-Match: an unchanged
     part answers 304 with no body, and htmx leaves it as it is (responseHandling in base.html). */
(function () {
  "use strict";

  function label(root) {
    var tables = root.querySelectorAll ? root.querySelectorAll("table.table") : [];
    Array.prototype.forEach.call(tables, function (table) {
      var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
        return th.textContent.trim();
      });
      if (!heads.length) return;
      Array.prototype.forEach.call(table.querySelectorAll("tbody tr"), function (row) {
        var column = 0;
        Array.prototype.forEach.call(row.children, function (cell) {
          if (!cell.hasAttribute("data-label") && heads[column]) cell.setAttribute("data-label", heads[column]);
          column += cell.colSpan || 1;
        });
      });
      table.classList.add("stackable");
    });
  }

  document.addEventListener("DOMContentLoaded", function () { label(document); });
  document.addEventListener("htmx:afterSettle", function () { label(document); });
  document.addEventListener("htmx:configRequest", function (event) {
    var tag = event.detail.elt.getAttribute("data-etag");
    if (tag) event.detail.headers["If-None-Match"] = tag;
  });
})();
