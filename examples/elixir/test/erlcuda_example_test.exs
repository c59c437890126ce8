defmodule ErlcudaExampleTest do
  # One gpud per device: the tests share it, one at a time.
  use ExUnit.Case, async: false
  import ExUnit.CaptureLog

  setup_all do
    {:ok, _} = Application.ensure_all_started(:erlcuda)
    ErlcudaExample.wait_ready()
    :ok
  end

  test "a kernel from Elixir" do
    assert {:ok, [4.0, 6.0]} = :erlcuda.launch_sync(:vector_add, [[1.0, 2.0], [3.0, 4.0]])
    assert {:ok, 10.0} = :erlcuda.launch_sync(:reduce, [[1, 2, 3, 4]])
  end

  test "f64 vectors and a scalar" do
    assert ErlcudaExample.saxpy(0.5, [2.0, 4.0], [1.0, 1.0]) == [2.0, 3.0]
  end

  test "typed binaries from lists and back" do
    {:f32, bin} = :erlcuda.from_list(:f32, [1.5, 2.0, :infinity])
    assert bin == <<1.5::float-32-native, 2.0::float-32-native, 0x7F800000::32-native>>
    assert {:ok, sum} = :erlcuda.launch_sync(:vector_add, [bin, bin])
    assert :erlcuda.to_list(sum) == [3.0, 4.0, :infinity]
    assert :erlcuda.to_list(:erlcuda.from_list(:u8, [1, 2, 255])) == [1, 2, 255]
    assert {:error, {:badarg, {:arg, 2}}} = :erlcuda.from_list(:f32, [1.0e300])
  end

  test "a charlist is a list of integers, taken as numbers" do
    assert {:ok, 294.0} = :erlcuda.launch_sync(:reduce, [~c"abc"])
    assert {:ok, 294.0} = :erlcuda.launch_sync(:reduce, [[97, 98, 99]])
  end

  test "launch returns at once; the answer is a message" do
    assert {:ok, 11.0} = ErlcudaExample.dot_async([1.0, 2.0], [3.0, 4.0])
  end

  test "errors are tuples, never raises" do
    assert {:error, {:badarg, {:arg, 1}}} = :erlcuda.launch_sync(:reduce, [[1.0, :foo]])
    assert {:error, {:unknown_kernel, :nope}} = :erlcuda.launch(:nope, [])
  end

  test "the kernel table" do
    names = for %{name: name} <- :erlcuda.kernels(), do: name
    assert :saxpy in names and :matmul in names
  end

  test "gpud's diagnostics arrive through Logger, with device and os_pid" do
    [%{os_pid: pid}] = :erlcuda.devices()

    log =
      capture_log([level: :info, metadata: [:device, :os_pid]], fn ->
        System.cmd("kill", ["-9", Integer.to_string(pid)])
        ErlcudaExample.wait_ready()
        Process.sleep(100)
      end)

    # The VM's own note of the exit, and the new gpud's ready line.
    assert log =~ "gpud exited"
    assert log =~ ~r/device=0 .*gpud\[0\]: ready/
    assert {:ok, [3.0]} = :erlcuda.launch_sync(:vector_add, [[1.0], [2.0]])
  end
end
