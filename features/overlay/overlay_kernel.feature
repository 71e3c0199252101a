@overlay_kernel
Feature: Overlay sandbox on a real OverlayFS mount (kernel mode)
  As an operator of plan executions on Linux
  I want the overlay strategy to use a real OverlayFS mount when the process may mount
  So that creating a sandbox costs nothing and commit writes only what changed

  Background:
    Given an ovl kernel source directory with "existing.txt" containing "original content"

  Scenario: Auto mode mounts OverlayFS when the process may mount
    When an ovl kernel sandbox is created in mode "auto"
    Then the ovl kernel sandbox uses overlay mode "kernel"
    And the ovl kernel merged directory is an overlay mount point

  Scenario: Writes land in the upper layer and never in the lower directory
    When an ovl kernel sandbox is created in mode "kernel"
    And the ovl kernel sandbox writes "notes.txt" with "draft"
    And the ovl kernel sandbox deletes "existing.txt"
    Then the ovl kernel original is unchanged
    And the ovl kernel upper layer holds a whiteout for "existing.txt"

  Scenario: Commit applies the change and remounts with an empty upper layer
    When an ovl kernel sandbox is created in mode "kernel"
    And the ovl kernel sandbox writes "notes.txt" with "draft"
    And the ovl kernel sandbox is committed
    Then the ovl kernel original file "notes.txt" contains "draft"
    And the ovl kernel upper layer is empty
    And the ovl kernel merged directory is an overlay mount point
    And the ovl kernel original holds no overlay artefacts

  Scenario: A commit that fails while swapping leaves the original exactly as it was
    When an ovl kernel sandbox is created in mode "kernel"
    And the ovl kernel sandbox writes "notes.txt" with "draft"
    And the ovl kernel sandbox writes "existing.txt" with "changed"
    And the ovl kernel commit is attempted while the second swap fails
    Then an ovl kernel SandboxCommitError is raised
    And the ovl kernel original is unchanged
    And the ovl kernel sandbox still shows "notes.txt" with "draft"

  Scenario: Rollback of an active sandbox empties the upper layer
    When an ovl kernel sandbox is created in mode "kernel"
    And the ovl kernel sandbox writes "notes.txt" with "draft"
    And the ovl kernel sandbox is rolled back
    Then the ovl kernel upper layer is empty
    And the ovl kernel merged directory is an overlay mount point

  Scenario: Kernel mode where mounting is forbidden fails instead of falling back
    When an ovl kernel sandbox is created in mode "kernel" while mount fails with EPERM
    Then an ovl kernel SandboxCreationError is raised
    And the ovl kernel sandbox status is "errored"

  Scenario: Auto mode falls back to userspace when mounting is forbidden
    When an ovl kernel sandbox is created in mode "auto" while mount fails with EPERM
    Then the ovl kernel sandbox uses overlay mode "fallback"
    And the ovl kernel fallback reason mentions "Operation not permitted"

  Scenario: Cleanup unmounts the overlay and removes every artefact
    When an ovl kernel sandbox is created in mode "kernel"
    And the ovl kernel sandbox is cleaned up
    Then the ovl kernel merged directory is not mounted
    And the ovl kernel base path does not exist
