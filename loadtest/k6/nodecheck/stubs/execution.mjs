// Mutable stand-in for k6/execution; run.mjs sets the fields before each iteration.
const exec = { scenario: { iterationInTest: 0 }, vu: { idInTest: 1, iterationInScenario: 0 } };
export default exec;
