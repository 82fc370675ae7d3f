// Writes tests/data/ecs_flat_8.11.json from @elastic/ecs's generated ecs_flat: per field its type,
// whether it is an array, its allowed values and, for event.category, each value's expected
// event.type values.  Usage: node extract.js PACKAGE_DIR > ecs_flat_8.11.json
const path = require("path");
const dir = process.argv[2];
const { EcsFlat } = require(path.join(dir, "generated/ecs_flat.js"));
const version = require(path.join(dir, "package.json")).version;
const lines = [];
for (const name of Object.keys(EcsFlat).sort()) {
  const f = EcsFlat[name];
  const out = { type: f.type };
  if (f.normalize && f.normalize.includes("array")) out.array = true;
  if (f.allowed_values) {
    out.allowed = f.allowed_values.map((v) => v.name);
    const expected = {};
    for (const v of f.allowed_values) if (v.expected_event_types) expected[v.name] = v.expected_event_types;
    if (Object.keys(expected).length) out.expected_event_types = expected;
  }
  lines.push(`${JSON.stringify(name)}: ${JSON.stringify(out)}`);
}
process.stdout.write(
  `{"source": "@elastic/ecs ${version} (npm), generated/ecs_flat.js: flat_name -> type, array, allowed values, expected_event_types",\n"fields": {\n` +
    lines.join(",\n") + "\n}}\n"
);
