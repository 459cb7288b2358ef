;; memgrow: policy_eval grows memory until memory.grow fails, then traps.
(module
  (memory (export "memory") 1)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64)
    (loop $more
      (br_if $more (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    (unreachable)))
