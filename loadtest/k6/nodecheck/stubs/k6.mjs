export const checks = { pass: 0, fail: 0 };
export function check(val, sets) {
  let ok = true;
  for (const name of Object.keys(sets)) {
    if (sets[name](val)) {
      checks.pass++;
    } else {
      checks.fail++;
      ok = false;
    }
  }
  return ok;
}
