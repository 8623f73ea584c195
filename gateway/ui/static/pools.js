// The Pools page: each template's warm pool, live.
import { el, live, meter } from "./ui.js";

const root = document.getElementById("pools");
const body = root.querySelector("tbody");

function row(pool) {
  const f = pool.figures;
  const target = f.target ?? 0;
  const ready = f.ready ?? 0;
  const cell = (value) => el("td", { class: "num" }, value ?? "–");
  return el("tr", { "data-template": pool.template },
    el("td", {}, el("a", { class: "id-link", href: `/ui/templates#template-${pool.template}` }, pool.template)),
    el("td", { class: "num" }, `${ready} / ${target}`, target ? meter(ready / target, true) : null),
    cell(f.starting),
    cell(f.claims),
    cell(f.misses),
    cell(f.refill_rate === undefined ? undefined : `${(f.refill_rate * 60).toFixed(1)} / min`),
    cell(f.refilled),
    cell(f.failures),
    cell(f.discarded),
  );
}

live(root.dataset.events, (data) => {
  const pools = data.pools || [];
  body.replaceChildren(...(pools.length
    ? pools.map(row)
    : [el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No template has a warm pool."))]));
});
