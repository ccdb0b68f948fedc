// Open the <details> a URL hash points at (a matrix cell or a case), and every <details> around it.
function teVerifyOpen() {
  var id = decodeURIComponent(window.location.hash.slice(1));
  var target = id ? document.getElementById(id) : null;
  if (!target) return;
  for (var node = target; node; node = node.parentElement) {
    if (node.tagName === "DETAILS") node.open = true;
  }
  target.scrollIntoView();
  document.body.setAttribute("data-opened", id);
}
window.addEventListener("hashchange", teVerifyOpen);
document.addEventListener("DOMContentLoaded", teVerifyOpen);

// Each lane's matrix records its rendered width (data-width, CSS pixels): a browser test holds it to the window.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("table.matrix").forEach(function (table) {
    table.setAttribute("data-width", String(table.scrollWidth));
  });
});
