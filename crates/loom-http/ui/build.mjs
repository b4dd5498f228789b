// Builds the viewer into dist/ (index.html, app.js, app.css): one minified ES module, no
// source map, no timestamps, so the same sources give the same bytes (`.ci/run` checks that
// the committed dist/ is what the sources build).
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";

mkdirSync("dist", { recursive: true });
await build({
  entryPoints: ["src/main.ts"],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  legalComments: "none",
  charset: "utf8",
  outfile: "dist/app.js",
  logLevel: "warning",
});
await build({
  entryPoints: ["src/style.css"],
  bundle: true,
  minify: true,
  outfile: "dist/app.css",
  logLevel: "warning",
});
copyFileSync("index.html", "dist/index.html");
