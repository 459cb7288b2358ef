;; loop: policy_eval spins in a tight wasm loop with no calls.
(module
  (memory (export "memory") 1)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64)
    (loop $forever (br $forever))
    (i64.const 0)))
